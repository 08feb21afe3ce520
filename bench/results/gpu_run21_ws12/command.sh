# Device command: main against the warp-specialized kernel with 4 PV warps (ws), 8 PV warps
# (ws12: 12 warps, 3 per SM sub-partition) and 8 PV warps with 4 P buffers (ws12p4). Full kernel
# GPU tests for ws12p4, a smoke subset for ws12, then all four timed on a few shapes.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run21; mkdir -p $R; trap 'tar -czf $OUT/run21.tgz -C /tmp run21; cp $R/compare.txt $OUT/ 2>/dev/null' EXIT
wv() { local n=$1; shift; PYTHONPATH=$PWD/ab/$n/kernel:$PWD/services/inference:$PYTHONPATH KDTREE_BUILD_DIR=/tmp/ab-build/$n "$@"; }
V="main ws ws12 ws12p4"
for n in $V; do wv $n python3 -m kdtree_verify._build > $R/$n.build.log 2>&1 & done; wait
tail -n1 $R/*.build.log
wv ws12p4 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" > $R/ws12p4.test.log 2>&1; echo "ws12p4 test rc $?"; tail -1 $R/ws12p4.test.log
wv ws12 timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" -k "ragged_draft or late_score or graph or variants" > $R/ws12.test.log 2>&1; echo "ws12 test rc $?"; tail -1 $R/ws12.test.log
SH=1x8x8x4096,1x8x8x32768,1x8x16x32768,1x128x16x32768,8x16x16x4096,8x8x8x32768,32x128x16x4096,8x128x32x32768
for n in $V; do wv $n timeout 120 python3 bench/kernel_bench.py --kdtree-only --shapes $SH --out $R/$n.json > $R/$n.bench.log 2>&1; echo "bench $n rc $?"; done
python3 bench/compare_runs.py $R/main.json $R/ws.json $R/ws12.json $R/ws12p4.json | tee $R/compare.txt
