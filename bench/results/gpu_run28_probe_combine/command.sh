#!/usr/bin/env bash
# Device command of run 28: A/B main / cb / pdl at the small shapes (+ a few large), full kernel
# tests of pdl, then the timeline probe of main.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
mkdir -p $OUT/r
trap 'tar -czf $OUT/run28.tgz -C $OUT r' EXIT
# probe build in the background while the A/B runs
PYTHONPATH=$PWD/ab_probe/probe/kernel:$PYTHONPATH KDTREE_BUILD_DIR=/tmp/ab-build/probe python3 -m kdtree_verify._build > $OUT/r/probe.build.log 2>&1 &
probe_pid=$!
SHAPES=1x8x8x4096,1x8x16x4096,1x8x32x4096,1x16x8x4096,1x16x16x4096,1x16x32x4096,1x8x8x32768,8x8x8x4096,1x16x16x32768,8x16x16x4096,1x128x16x32768,32x8x16x4096,1x8x16x131072
AB_TESTS="graph or late_score or ragged or input_variants" AB_BENCH_ARGS="--shapes $SHAPES" OUT=$OUT/r bash bench/ab_kernels.sh run 2>&1 | tee $OUT/r/ab.log
# full kernel suite on pdl
bash bench/ab_kernels.sh with pdl python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" > $OUT/r/pdl.fulltest.log 2>&1; tail -3 $OUT/r/pdl.fulltest.log
# timeline probe (main + probe stamps)
wait $probe_pid; tail -2 $OUT/r/probe.build.log
PYTHONPATH=$PWD/ab_probe/probe/kernel:$PWD/services/inference:$PYTHONPATH KDTREE_BUILD_DIR=/tmp/ab-build/probe python3 ab_probe/tools/probe_timeline.py 2>&1 | tee $OUT/r/probe.log
