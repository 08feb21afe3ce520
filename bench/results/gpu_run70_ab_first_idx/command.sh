#!/usr/bin/env bash
# Device command of run 70: how much of a small call's time is the first KV tile's index round
# trip (schedule -> kv_indices -> KV rows)? experiment/ablate-first-idx (fa256d0, timing only:
# tile 0's rows taken at kv_start + j without reading kv_indices, so its results are wrong)
# against main (08a6652), three interleaved passes over small shapes and two large controls.
# main's full kernel test suite runs first (its tests/gpu changed since run 69).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
AB_TESTS="not nothing" AB_TEST_VARIANTS="main" AB_REPEATS=3 OUT=$OUT \
  AB_BENCH_ARGS="--shapes 1x8x8x4096,1x8x8x32768,1x8x16x4096,1x16x8x4096,1x16x16x4096,8x8x8x4096,1x128x16x32768,32x16x16x4096" \
  timeout 540 bash bench/ab_kernels.sh run
