#!/usr/bin/env bash
# Device command of run 33: two measured-not-kept experiments against main: split partials in
# bf16, and each warp's own S sub-tile kept in registers (3 of 4 exchanged through shared memory).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
mkdir -p $OUT/r
SHAPES=1x8x8x4096,1x8x16x4096,1x8x32x4096,1x16x8x4096,1x16x16x4096,1x16x32x4096,1x8x8x32768,8x8x8x4096,1x16x16x32768,8x16x16x4096,1x128x16x32768,32x8x16x4096,8x128x16x4096,32x128x8x4096
AB_TESTS="sweep_against_reference or cpu_specification or graph or late_score" AB_BENCH_ARGS="--shapes $SHAPES" OUT=$OUT/r bash bench/ab_kernels.sh run 2>&1 | tee $OUT/r/ab.log
