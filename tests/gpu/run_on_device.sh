#!/usr/bin/env bash
# The GPU run, on the GPU machine, over artifacts built on a machine without a GPU:
#   python tests/gpu/build_artifacts.py .aotc-cache/gpu          (build machine; Triton 3.9 here)
#   python benchmarks/gpu_latency.py build .aotc-cache/gpu-bench (build machine)
#   bash tests/gpu/run_on_device.sh                              (GPU machine; carry .aotc-cache/gpu*, .whl)
# Installs carried wheels (cffi) if any, makes the checkout importable without pip install, runs the GPU
# tests (each case in a process where torch cannot load) and the latency benchmark. Logs go to $OUT.
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
mkdir -p /tmp/shim && ln -sfn "$PWD/runtime" /tmp/shim/aotc && ln -sfn "$PWD/aot" /tmp/shim/aotc_build
export PYTHONPATH=/tmp/site:/tmp/shim${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, numpy, cffi; print(sys.version); print('numpy', numpy.__version__, 'cffi', cffi.__version__)"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} > "$OUT/env.txt" 2>&1
for art in .aotc-cache/gpu .aotc-cache/gpu36; do
  [ -f "$art/index.json" ] || continue
  name=$(basename "$art")
  extra=$([ "$name" = gpu ] && echo tests/gpu/test_torch_interop.py)
  AOTC_GPU_ARTIFACTS=$art AOTC_GPU_RESULTS="$OUT/cases_$name.jsonl" timeout 300 \
    python3 -m pytest -q -p no:cacheprovider --confcutdir tests/gpu tests/gpu/test_cuda_cases.py $extra 2>&1 \
    | tee "$OUT/pytest_$name.log" | tail -25
done
if [ -d .aotc-cache/gpu-bench ]; then
  timeout 240 python3 benchmarks/gpu_latency.py run .aotc-cache/gpu-bench --json "$OUT/bench.json" 2>&1 \
    | tee "$OUT/bench.log" | tail -8
fi
