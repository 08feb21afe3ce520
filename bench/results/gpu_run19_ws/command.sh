# Device command: build main and experiment/warp-specialized, run the kernel GPU tests of the
# latter (timeouts guard against a barrier deadlock), then time both on a few shapes.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run19; mkdir -p $R; trap 'tar -czf $OUT/run19.tgz -C /tmp run19; cp $R/compare.txt $OUT/ 2>/dev/null' EXIT
WS=experiment_warp-specialized
wv() { local n=$1; shift; PYTHONPATH=$PWD/ab/$n/kernel:$PWD/services/inference:$PYTHONPATH KDTREE_BUILD_DIR=/tmp/ab-build/$n "$@"; }
wv main python3 -m kdtree_verify._build > $R/main.build.log 2>&1 &
wv $WS python3 -m kdtree_verify._build > $R/ws.build.log 2>&1; wait
tail -1 $R/ws.build.log
wv $WS timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" -k "ragged_draft or late_score" > $R/ws.smoke.log 2>&1; echo "smoke rc $?"; tail -5 $R/ws.smoke.log
wv $WS timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" > $R/ws.test.log 2>&1; echo "test rc $?"; grep -E "passed|failed|Error|error" $R/ws.test.log | tail -8
SH=1x8x8x4096,1x8x8x32768,1x8x16x32768,1x128x16x32768,8x16x16x4096,8x8x8x32768,32x128x16x4096
for n in main $WS; do wv $n timeout 120 python3 bench/kernel_bench.py --kdtree-only --shapes $SH --out $R/$n.json > $R/$n.bench.log 2>&1; echo "bench $n rc $?"; done
python3 bench/compare_runs.py $R/main.json $R/$WS.json | tee $R/compare.txt
