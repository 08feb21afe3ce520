#!/usr/bin/env bash
# Device command of run 42: main (311fb5e, kernel a946227) against two variants that interleave
# the next KV tile's 9 cp.async per thread with the S phase's 9 k-steps instead of issuing them as
# one burst at the loop top: il1 (one copy per k-step), il2 (two per k-step, done by step 5).
# The kernel GPU tests for both variants, then all three timed on 9 grid shapes, main first.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run42; mkdir -p $R; trap 'tar -czf $OUT/run42.tgz -C /tmp run42; cp $R/compare.txt $OUT/ 2>/dev/null' EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
wv() { local n=$1; shift; PYTHONPATH=$PWD/ab/$n/kernel:$PWD/services/inference:$PYTHONPATH KDTREE_BUILD_DIR=/tmp/ab-build/$n "$@"; }
V="main il1 il2"
for n in $V; do wv $n python3 -m kdtree_verify._build > $R/$n.build.log 2>&1 & done; wait
tail -n1 $R/*.build.log
for n in il1 il2; do wv $n timeout 110 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" > $R/$n.test.log 2>&1; echo "$n test rc $?: $(tail -1 $R/$n.test.log)"; done
SH=1x8x8x4096,1x8x8x32768,1x8x16x32768,1x128x16x32768,8x16x16x4096,8x8x8x32768,8x128x16x32768,32x128x16x4096,8x128x32x32768
for n in $V; do wv $n timeout 80 python3 bench/kernel_bench.py --kdtree-only --shapes $SH --out $R/$n.json > $R/$n.bench.log 2>&1; echo "bench $n rc $?"; done
python3 bench/compare_runs.py $R/main.json $R/il1.json $R/il2.json | tee $R/compare.txt
