#!/usr/bin/env bash
# Device command of run 39: main (edfeafb) against experiment/warp-specialized-2 (c5ba0ed, the
# warp-specialized kernel wsu1 with the synccheck fixes on today's main): the full kernel GPU tests
# for the branch, then both timed (our kernel alone) on 9 grid shapes, main first.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run39; mkdir -p $R; trap 'tar -czf $OUT/run39.tgz -C /tmp run39; cp $R/compare.txt $OUT/ 2>/dev/null' EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
wv() { local n=$1; shift; PYTHONPATH=$PWD/ab/$n/kernel:$PWD/services/inference:$PYTHONPATH KDTREE_BUILD_DIR=/tmp/ab-build/$n "$@"; }
V="main experiment_warp-specialized-2"
for n in $V; do wv $n python3 -m kdtree_verify._build > $R/$n.build.log 2>&1 & done; wait
tail -n1 $R/*.build.log
wv experiment_warp-specialized-2 timeout 210 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" > $R/ws2.test.log 2>&1; echo "ws2 test rc $?"; tail -1 $R/ws2.test.log
SH=1x8x8x4096,1x8x8x32768,1x8x16x32768,1x128x16x32768,8x16x16x4096,8x8x8x32768,8x128x16x32768,32x128x16x4096,8x128x32x32768
for n in $V; do wv $n timeout 100 python3 bench/kernel_bench.py --kdtree-only --shapes $SH --out $R/$n.json > $R/$n.bench.log 2>&1; echo "bench $n rc $?"; done
python3 bench/compare_runs.py $R/main.json $R/experiment_warp-specialized-2.json | tee $R/compare.txt
