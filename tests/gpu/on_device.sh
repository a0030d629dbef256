#!/usr/bin/env bash
# The H200 run, in steps that fit the device tool's 10-minute calls. Run from the repo root there:
#   bash tests/gpu/on_device.sh zoo-start packages zoo-wait     # call 1 (carry .gpu-artifacts .whl .whl-zoo)
#   bash tests/gpu/on_device.sh zoo-run bench                    # call 2, while the machine is still warm
# packages:  eager-on-CUDA references (cuda_refs.py), then test_packages_gpu.py over .gpu-artifacts, which
#            tests/gpu/make_artifacts.py built on a machine without a GPU.
# zoo-start: torch references for the real-size zoo, then one builder per model in the background with the
#            GPU hidden (real-size weights cannot travel; see benchmarks/gpu_zoo.py).
# zoo-wait:  waits for those builds; zoo-run: the runtime alone checks and times every package.
# bench:     benchmarks/gpu_examples.py, aotc with and without CUDA graphs, and eager torch.
# cases:     builds the shared kernel cases (tests/gpu/programs.py GPU_CASES) here with the GPU hidden, then runs
#            them (tests/gpu/test_cuda_cases.py): every template checked on the GPU in about two minutes.
# sbs-build, sbs-warm, sbs-run: benchmarks/gpu_side_by_side.py (SBS_MODELS, SBS_PRECISIONS, SBS_MODES, SBS_BUDGET_S, SBS_DIR,
#            SBS_WARM_JOBS; seen: 12 max-autotune warms side by side take ~200 s each and ResNet-50/Llama did not
#            finish in 400 s: warm one precision a call, then sbs-run in a call made at once, while the machine is warm),
#            SBS_JOBS, SBS_TUNE=1: tune on this GPU, which the build then sees).
# safety:    tests/gpu/test_safety_gpu.py and test_token_ids_gpu.py (they build their own packages here).
# cpu-sbs:   benchmarks/cpu_side_by_side.py on this host's CPU held to 2 cores (taskset), the issue's small
#            server: a second CPU beside the build machine's, and an AVX2-only one where the host has no AVX-512
#            (lscpu.txt says). CPU_MODELS (default: the first four and the extras, ~3.5 min; then
#            CPU_MODELS=gpt2_1 and CPU_MODELS=gpt2_4 with CPU_ARGS=--no-extras, ~1.5 and over 4 min: a call each),
#            CPU_ARGS (--avx2 for the stand-in).
# tune:      benchmarks/tune_table.py --write-table (TUNE_MODELS, TUNE_PRECISIONS); sm_90.json comes back in $OUT.
# .whl holds cffi + pycparser (the image lacks cffi); .whl-zoo the transformers release the zoo is written for.
set -uo pipefail
OUT=${OUT:-/tmp/out}
ZOO=/tmp/zoo
mkdir -p "$OUT" "$ZOO"
if [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
fi
if ls .whl-zoo/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site-zoo ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-zoo .whl-zoo/*.whl
fi
# aotc_build as pyproject maps it: aot/ with cpp_templates/ inside (a real folder, so no link writes into aot/)
[ -L /tmp/pp/aotc_build ] && rm /tmp/pp/aotc_build
mkdir -p /tmp/pp/aotc_build && ln -sfn "$PWD/runtime" /tmp/pp/aotc && ln -sfn "$PWD"/aot/* /tmp/pp/aotc_build/ &&
  ln -sfn "$PWD/cpp_templates" /tmp/pp/aotc_build/cpp_templates
export PYTHONPATH=/tmp/site:/tmp/pp PYTHONUNBUFFERED=1
ZOOPATH=/tmp/site-zoo:$PYTHONPATH
MODELS=${MODELS:-"resnet50 vit_b_16 mobilenet_v3_large convnext_tiny bert_base gpt2_small t5_small_encoder llama_4l_1024 hf_vit_base hf_resnet50 hf_convnext_tiny hf_mobilenet_v2"}
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, numpy, cffi, torch, triton; print(sys.version, numpy.__version__, cffi.__version__, torch.__version__, triton.__version__)"
  PYTHONPATH=$ZOOPATH python3 -c "import transformers; print('transformers', transformers.__version__)"
} > "$OUT/env.txt" 2>&1

for step in "$@"; do
  echo "== $step $(date -u +%T)"
  case $step in
    packages)
      python3 tests/gpu/cuda_refs.py .gpu-artifacts > "$OUT/cuda_refs.log" 2>&1 || tail -20 "$OUT/cuda_refs.log"
      rm -f "$OUT/packages.jsonl"
      AOTC_GPU_ARTIFACTS=.gpu-artifacts AOTC_REQUIRE_CUDA_REFS=1 AOTC_GPU_RESULTS="$OUT/packages.jsonl" timeout 420 \
        python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_packages_gpu.py 2>&1 \
        | tee "$OUT/pytest_packages.log" | tail -15 ;;
    zoo-start)
      PYTHONPATH=$ZOOPATH python3 benchmarks/gpu_zoo.py ref "$ZOO" $MODELS 2>&1 | grep -v Warning > "$ZOO/ref.log"
      tail -3 "$ZOO/ref.log"
      for m in $MODELS; do  # setsid: the builders outlive this call; zoo-wait collects them
        CUDA_VISIBLE_DEVICES= PYTHONPATH=$ZOOPATH setsid bash -c \
          "python3 benchmarks/gpu_zoo.py build $ZOO $m > $ZOO/build_$m.log 2>&1; echo \$? > $ZOO/build_$m.rc" &
      done ;;
    llama-capture)  # capture only, with the image's own transformers: tells torch from transformers trouble
      CUDA_VISIBLE_DEVICES= TORCH_LOGS=dynamic python3 - > "$OUT/llama_capture.log" 2>&1 <<'PY'
import sys, traceback
sys.path.insert(0, "tests")
import torch, transformers
from aotc_build.capture import capture_module
from zoo.models import REAL, ZOO, FirstOutput, dynamic_shapes, inputs, real_dynamic, real_inputs, real_module
print("torch", torch.__version__, "transformers", transformers.__version__)
small = next(z for z in ZOO if z.name == "llama")
real = next(m for m in REAL if m.name == "llama_4l_1024")


class NoCache(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x, use_cache=False, return_dict=False)[0]


for name, make in (("small", lambda: capture_module(FirstOutput(small.make()), inputs(small, 2), dynamic_shapes(small))),
                   ("small use_cache=False", lambda: capture_module(NoCache(small.make()), inputs(small, 2), dynamic_shapes(small))),
                   ("real", lambda: capture_module(real_module(real), real_inputs(real, 4, 128), real_dynamic(real)))):
    try:
        make(); print(name, "captured")
    except Exception as e:
        print(name, "FAILED", e)
PY
      grep -E "captured|FAILED" "$OUT/llama_capture.log" ;;
    zoo-wait)
      for _ in $(seq 1 ${ZOO_WAIT_S:-400}); do
        n=$(ls "$ZOO"/build_*.rc 2>/dev/null | wc -l); [ "$n" -ge "$(echo $MODELS | wc -w)" ] && break; sleep 1
      done
      for f in "$ZOO"/build_*.log; do echo "--- $f rc=$(cat "${f%.log}.rc" 2>/dev/null)"; grep -v Warning "$f" | tail -40; done \
        > "$OUT/zoo_build.log"
      cp "$ZOO/ref.log" "$OUT/zoo_ref.log"; grep -h "^built" "$ZOO"/build_*.log ;;
    zoo-run)
      python3 benchmarks/gpu_zoo.py run "$ZOO" "$OUT/gpu_zoo.json" 2>&1 | tee "$OUT/zoo_run.log" | cut -c1-200 ;;
    bench)
      python3 benchmarks/gpu_examples.py .gpu-artifacts "$OUT/gpu_examples_aotc.json" 2>&1 | tee "$OUT/bench.log"
      python3 benchmarks/gpu_examples.py .gpu-artifacts "$OUT/gpu_examples_torch.json" --torch 2>&1 | tee -a "$OUT/bench.log" ;;
    cases)
      CUDA_VISIBLE_DEVICES= python3 tests/gpu/build_artifacts.py /tmp/cases > "$OUT/cases_build.log" 2>&1 || tail -20 "$OUT/cases_build.log"
      AOTC_GPU_ARTIFACTS=/tmp/cases AOTC_GPU_RESULTS="$OUT/cases.jsonl" timeout 300 python3 -m pytest -q -p no:cacheprovider \
        --confcutdir tests/gpu tests/gpu/test_cuda_cases.py tests/gpu/test_torch_interop.py 2>&1 | tee "$OUT/pytest_cases.log" | tail -15 ;;
    safety)  # issue 12/13 on a real GPU: threads, close during calls, OOM, the PTX path, token-id checks
      timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_safety_gpu.py tests/gpu/test_token_ids_gpu.py \
        2>&1 | tee "$OUT/pytest_safety.log" | tail -25 ;;
    cpu-sbs)
      lscpu > "$OUT/lscpu.txt" 2>&1
      isa=$(grep -q avx512f /proc/cpuinfo && echo avx512 || echo avx2only)
      name=cpu_side_by_side_device_${isa}_$(echo "${CPU_MODELS:-base}" | tr ',' '-')$(echo "${CPU_ARGS:-}" | tr -cd 'a-z0-9')
      CUDA_VISIBLE_DEVICES= taskset -c 0,1 python3 benchmarks/cpu_side_by_side.py --threads 2 \
        --models "${CPU_MODELS:-mlp,cnn,bert,mobilenet}" ${CPU_ARGS:-} --out "$OUT/$name.json" 2>&1 \
        | grep -v -i warn | tee "$OUT/$name.log" | tail -12 ;;
    sbs-build)
      PYTHONPATH=$ZOOPATH python3 benchmarks/gpu_side_by_side.py build "${SBS_DIR:-/tmp/sbs}" --precisions "${SBS_PRECISIONS:-bf16}" \
        ${SBS_MODELS:+--models "$SBS_MODELS"} --jobs "${SBS_JOBS:-12}" $([ "${SBS_TUNE:-0}" = 1 ] && echo --tune) 2>&1 | grep -v Warn | tee -a "$OUT/sbs_build.log" | grep -E "built|FAIL|all" ;;
    sbs-warm)  # torch's compile caches filled in parallel processes, so that sbs-run compiles from them
      PYTHONPATH=$ZOOPATH python3 benchmarks/gpu_side_by_side.py warm "${SBS_DIR:-/tmp/sbs}" --precisions "${SBS_PRECISIONS:-bf16}" \
        ${SBS_MODELS:+--models "$SBS_MODELS"} --modes "${SBS_MODES:-reduce-overhead,max-autotune}" --jobs "${SBS_WARM_JOBS:-6}" 2>&1 \
        | tee -a "$OUT/sbs_warm.log" | grep -E "^warm" ;;
    sbs-run)
      PYTHONPATH=$ZOOPATH timeout "${SBS_TIMEOUT_S:-560}" python3 benchmarks/gpu_side_by_side.py run "${SBS_DIR:-/tmp/sbs}" "$OUT/side_by_side.json" \
        ${SBS_MODELS:+--models "$SBS_MODELS"} \
        --precisions "${SBS_PRECISIONS:-bf16}" --modes "${SBS_MODES:-eager,reduce-overhead,max-autotune}" \
        --budget-s "${SBS_BUDGET_S:-420}" 2>&1 | grep -v Warn | tee -a "$OUT/sbs_run.log" | cut -c1-220 ;;
    tune)  # benchmarks/tune_table.py over TUNE_MODELS x TUNE_PRECISIONS; the table it writes comes back in $OUT
      PYTHONPATH=$ZOOPATH AOTC_CACHE_DIR=/tmp/tune-cache timeout "${TUNE_TIMEOUT_S:-500}" python3 benchmarks/tune_table.py \
        "$OUT/tune_table.json" --write-table --models="${TUNE_MODELS:-mlp,gpt2,bert,vit,resnet50,llama,mm4096,attn,ln8192}" \
        --precisions="${TUNE_PRECISIONS:-bf16}" 2>&1 | grep -v Warn | tee "$OUT/tune_table.log" | tail -60
      cp aot/codegen/triton/tables/sm_90.json "$OUT/" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
