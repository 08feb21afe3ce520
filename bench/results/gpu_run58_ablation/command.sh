#!/usr/bin/env bash
# Device command of run 58: an ablation of the attention kernel's main loop, to bound what any
# schedule that overlaps its serial phases could gain with this tiling. Timing only: the three
# variants compute wrong results on purpose and run no tests. main (kernel 33e6a04) against
# experiment/ablate-reduce (no cross-warp S reduction), experiment/ablate-serial (also no mask,
# softmax or P barrier) and experiment/ablate-mma (also no KV loads after the first tile), two
# interleaved kdtree-only passes over 18 grid shapes, memory- and compute-bound.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
SHAPES=1x8x8x4096,1x8x8x32768,1x8x8x131072,1x8x16x32768,1x8x16x131072,1x16x16x32768
SHAPES+=,1x128x8x32768,1x128x16x32768,1x128x16x131072,1x128x32x32768,8x8x8x32768,8x16x16x32768
SHAPES+=,8x128x16x32768,32x8x8x131072,32x8x16x32768,32x16x16x32768,32x128x16x32768,32x128x32x32768
AB_BENCH_ARGS="--shapes $SHAPES" AB_REPEATS=2 OUT=$OUT timeout 560 bash bench/ab_kernels.sh run
echo "ab_kernels rc $? at ${SECONDS}s"
