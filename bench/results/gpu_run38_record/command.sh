#!/usr/bin/env bash
# Device command of run 38: the kernel of runs 36-37 (a946227): the last 22 grid shapes (prefix
# 128k; every contender), which run 37 did not reach.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.stubs:$PWD/kernel:$PWD/services/inference KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run38; mkdir -p $R; pack() { tar -czf $OUT/run38.tgz -C /tmp run38; }; trap pack EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
python3 -m kdtree_verify._build 2>&1 | tail -1 | tee $R/build.log
S=1x16x32x131072,1x128x8x131072,1x128x16x131072,1x128x32x131072,8x8x8x131072,8x8x16x131072,8x8x32x131072,8x16x8x131072,8x16x16x131072,8x16x32x131072,8x128x8x131072,8x128x16x131072,8x128x32x131072
S=$S,32x8x8x131072,32x8x16x131072,32x8x32x131072,32x16x8x131072,32x16x16x131072,32x16x32x131072,32x128x8x131072,32x128x16x131072,32x128x32x131072
timeout 320 python3 bench/kernel_bench.py --shapes $S --out $R/h200_part4.json 2>&1 | while IFS= read -r l; do echo "$(date +%T) $l"; done > $R/bench_part4.log; echo "part 4 done"; grep -c kdtree $R/bench_part4.log
