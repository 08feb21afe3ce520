#!/usr/bin/env bash
# Device command of run 65, the shipped code (attention kernel 33e6a04, the host-chosen combine
# batch): the backend's layer benchmark and the engine's 100-prompt GPU parity, refreshing
# layer_h200.json and engine_gpu_parity.json (last measured on kernel d3e3bec in run 49). Run 63
# passed all 122 GPU tests on the same code.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs:$PWD/kernel:$PWD/services/inference KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $OUT/gpu.txt
python3 -m kdtree_verify._build > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "built at ${SECONDS}s"
timeout 100 python3 bench/layer_bench.py --out $OUT/layer_h200.json > $OUT/layer_bench.log 2>&1
echo "layer_bench rc $? at ${SECONDS}s"; tail -4 $OUT/layer_bench.log
timeout 120 python3 -m kdtree_inference.engine.gpu_parity --prompts 100 --out $OUT/engine_gpu_parity.json > $OUT/engine_gpu_parity.log 2>&1
echo "gpu_parity rc $? at ${SECONDS}s"; tail -2 $OUT/engine_gpu_parity.log
