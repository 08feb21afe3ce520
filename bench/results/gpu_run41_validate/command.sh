#!/usr/bin/env bash
# Device command of run 41, main ee32ce4 (kernel a946227; ran as 9e1cf9a, the same tree before a commit split): all GPU tests, the backend's layer
# benchmark and the engine's 100-prompt GPU parity (refreshing layer_h200.json and
# engine_gpu_parity.json, last measured with kernel a6deb56 in run 13), and first a try of
# carrying Triton's cache: ab_probe/run40-triton-cache.tgz is run 40's $OUT/triton-cache.tgz
# (verify_shared_kv_fwd at B=32, H=128, T=32, 128k; 1.5 MB, not committed). One shape is
# benchmarked with every contender, before anything else uses Triton, to see what still compiles.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs:$PWD/kernel:$PWD/services/inference KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$PWD/.triton-cache; mkdir -p $TRITON_CACHE_DIR && tar -xzf ab_probe/run40-triton-cache.tgz -C $TRITON_CACHE_DIR --strip-components=1
R=/tmp/run41; mkdir -p $R; ls $TRITON_CACHE_DIR > $R/triton_cache_before.txt
pack() { ls $TRITON_CACHE_DIR > $R/triton_cache_after.txt; tar -czf $OUT/run41.tgz -C /tmp run41; tar -czf $OUT/triton-cache.tgz -C $PWD .triton-cache; }; trap pack EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
python3 -m kdtree_verify._build 2>&1 | tail -1 | tee $R/build.log
timeout 120 python3 bench/kernel_bench.py --shapes 8x128x16x32768 --out $R/cache_probe.json 2>&1 | while IFS= read -r l; do echo "$(date +%T) $l"; done > $R/cache_probe.log; grep "kdtree " $R/cache_probe.log
ls $TRITON_CACHE_DIR > $R/triton_cache_after_probe.txt
s=$(date +%s); timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu -o addopts="" > $R/test.log 2>&1; echo "tests rc $? in $(( $(date +%s) - s )) s: $(tail -1 $R/test.log)"
timeout 90 python3 bench/layer_bench.py --out $R/layer_h200.json > $R/layer_bench.log 2>&1; echo "layer_bench rc $?"; tail -5 $R/layer_bench.log
timeout 90 python3 -m kdtree_inference.engine.gpu_parity --prompts 100 --out $R/engine_gpu_parity.json > $R/engine_gpu_parity.log 2>&1; echo "gpu_parity rc $?"; tail -1 $R/engine_gpu_parity.log
