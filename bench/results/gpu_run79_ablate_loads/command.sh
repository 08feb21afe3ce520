#!/usr/bin/env bash
# Load ablation of the attention kernel's main loop (timing only: the two variants compute wrong
# results on purpose): main against abl_noloads (no KV or index loads after the prologue) and
# abl_halfloads (5 of the 9 16-byte copies per thread per tile), two interleaved kdtree-only
# passes over run 58's 18 shapes.
set -uo pipefail
export KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
SHAPES=1x8x8x4096,1x8x8x32768,1x8x8x131072,1x8x16x32768,1x8x16x131072,1x16x16x32768
SHAPES+=,1x128x8x32768,1x128x16x32768,1x128x16x131072,1x128x32x32768,8x8x8x32768,8x16x16x32768
SHAPES+=,8x128x16x32768,32x8x8x131072,32x8x16x32768,32x16x16x32768,32x128x16x32768,32x128x32x32768
AB_BENCH_ARGS="--shapes $SHAPES" AB_REPEATS=2 OUT=$OUT timeout 540 bash bench/ab_kernels.sh run
echo "ab_kernels rc $? at ${SECONDS}s"
ls -la $OUT
