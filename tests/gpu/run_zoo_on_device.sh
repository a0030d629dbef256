#!/usr/bin/env bash
# On the H200 machine: real-size zoo. torch makes references, the builder runs with the GPU hidden
# (one process per model, in parallel), then the runtime alone checks and times every package.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/pp && ln -sfn "$PWD/runtime" /tmp/pp/aotc && ln -sfn "$PWD/aot" /tmp/pp/aotc_build
export PYTHONPATH=/tmp/site:/tmp/pp PYTHONUNBUFFERED=1
D=/tmp/zoo; mkdir -p "$D"; OUT=${OUT:-/tmp/out}
MODELS=${MODELS:-"resnet50 vit_b_16 mobilenet_v3_large convnext_tiny bert_base gpt2_small t5_small_encoder llama_4l_1024"}
python3 benchmarks/gpu_zoo.py ref "$D" $MODELS 2>&1 | grep -v Warning | tee "$OUT/zoo_ref.log" | tail -20
for m in $MODELS; do
  CUDA_VISIBLE_DEVICES= python3 benchmarks/gpu_zoo.py build "$D" "$m" > "$OUT/zoo_build_$m.log" 2>&1 &
done
wait
grep -h "built\|Error" "$OUT"/zoo_build_*.log | tail -30
python3 benchmarks/gpu_zoo.py run "$D" "$OUT/gpu_zoo.json" 2>&1 | tee "$OUT/zoo_run.log" | tail -30
