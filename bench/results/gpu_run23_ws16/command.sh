# Device command: main against the warp-specialized kernel (unrolled, one S accumulator set: wsu1)
# and its 16-warp variant (ws16: 8 softmax warps, one m-tile x dim quarter each, and 8 PV warps at
# 128 registers). Full kernel GPU tests for ws16, all three timed on a few shapes.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run23; mkdir -p $R; trap 'tar -czf $OUT/run23.tgz -C /tmp run23; cp $R/compare.txt $OUT/ 2>/dev/null' EXIT
wv() { local n=$1; shift; PYTHONPATH=$PWD/ab/$n/kernel:$PWD/services/inference:$PYTHONPATH KDTREE_BUILD_DIR=/tmp/ab-build/$n "$@"; }
V="main wsu1 ws16"
for n in $V; do wv $n python3 -m kdtree_verify._build > $R/$n.build.log 2>&1 & done; wait
tail -n1 $R/*.build.log
wv ws16 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" > $R/ws16.test.log 2>&1; echo "ws16 test rc $?"; tail -1 $R/ws16.test.log
SH=1x8x8x4096,1x8x8x32768,1x8x16x32768,1x128x16x32768,8x16x16x4096,8x8x8x32768,32x128x16x4096,8x128x32x32768
for n in $V; do wv $n timeout 120 python3 bench/kernel_bench.py --kdtree-only --shapes $SH --out $R/$n.json > $R/$n.bench.log 2>&1; echo "bench $n rc $?"; done
python3 bench/compare_runs.py $R/main.json $R/wsu1.json $R/ws16.json | tee $R/compare.txt
