#!/usr/bin/env bash
# Device command of run 30: A/B main / pdl1 / pdl_attn / tilemeta at the small shapes (+ a few large),
# graph/ragged/variant tests of each, the full kernel suite of tilemeta.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
mkdir -p $OUT/r
trap 'tar -czf $OUT/run30.tgz -C $OUT r' EXIT
SHAPES=1x8x8x4096,1x8x16x4096,1x8x32x4096,1x16x8x4096,1x16x16x4096,1x16x32x4096,1x8x8x32768,8x8x8x4096,1x16x16x32768,8x16x16x4096,1x128x16x32768,32x8x16x4096,1x8x16x131072
AB_TESTS="graph or late_score or ragged or input_variants" AB_BENCH_ARGS="--shapes $SHAPES" OUT=$OUT/r bash bench/ab_kernels.sh run 2>&1 | tee $OUT/r/ab.log
bash bench/ab_kernels.sh with tilemeta python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" > $OUT/r/tilemeta.fulltest.log 2>&1; tail -3 $OUT/r/tilemeta.fulltest.log
# compute-sanitizer on tilemeta (PDL in both launches, the TileMeta table)
for tool in memcheck synccheck racecheck; do
  bash bench/ab_kernels.sh with tilemeta compute-sanitizer --tool $tool --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py > $OUT/r/tilemeta.$tool.log 2>&1
  echo "$tool rc=$?"; tail -2 $OUT/r/tilemeta.$tool.log
done
