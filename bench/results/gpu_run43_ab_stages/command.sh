#!/usr/bin/env bash
# Device command of run 43: main (f87db6c, kernel a946227) against st3, an H200-only diagnostic:
# the same lockstep kernel with three 32-token KV stages (131,584 B of shared memory, over
# sm_120's 101,376), so each tile's copies have two iterations in flight instead of one. Does the
# pipeline depth limit the kernel? The kernel GPU tests for st3, then both timed on 11 shapes.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run43; mkdir -p $R; trap 'tar -czf $OUT/run43.tgz -C /tmp run43; cp $R/compare.txt $OUT/ 2>/dev/null' EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
wv() { local n=$1; shift; PYTHONPATH=$PWD/ab/$n/kernel:$PWD/services/inference:$PYTHONPATH KDTREE_BUILD_DIR=/tmp/ab-build/$n "$@"; }
V="main st3"
for n in $V; do wv $n python3 -m kdtree_verify._build > $R/$n.build.log 2>&1 & done; wait
tail -n1 $R/*.build.log
wv st3 timeout 110 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" > $R/st3.test.log 2>&1; echo "st3 test rc $?: $(tail -1 $R/st3.test.log)"
SH=1x8x8x4096,1x8x8x32768,1x8x16x32768,1x128x16x32768,8x8x8x4096,8x16x16x4096,8x8x8x32768,32x8x8x131072,8x128x16x32768,32x128x16x4096,8x128x32x32768
for n in $V; do wv $n timeout 90 python3 bench/kernel_bench.py --kdtree-only --shapes $SH --out $R/$n.json > $R/$n.bench.log 2>&1; echo "bench $n rc $?"; done
python3 bench/compare_runs.py $R/main.json $R/st3.json | tee $R/compare.txt
