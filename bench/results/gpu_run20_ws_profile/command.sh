# Device command: main, experiment/warp-specialized (4 stages) and the H200-only diagnostic ws8
# (8 stages, 163 KB of shared memory: does more data in flight help?) on a few shapes, then
# Nsight Compute on the warp-specialized kernel (warp states and per-SASS-instruction samples).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run20; mkdir -p $R; trap 'tar -czf $OUT/run20.tgz -C /tmp run20; cp $R/compare.txt $OUT/ 2>/dev/null' EXIT
WS=experiment_warp-specialized
wv() { local n=$1; shift; PYTHONPATH=$PWD/ab/$n/kernel:$PWD/services/inference:$PYTHONPATH KDTREE_BUILD_DIR=/tmp/ab-build/$n "$@"; }
for n in main $WS ws8; do wv $n python3 -m kdtree_verify._build > $R/$n.build.log 2>&1 & done; wait
tail -n1 $R/*.build.log
wv ws8 timeout 90 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" -k "ragged_draft or late_score or graph" > $R/ws8.test.log 2>&1; echo "ws8 test rc $?"; tail -1 $R/ws8.test.log
SH=1x8x8x4096,1x8x8x32768,1x8x16x32768,1x128x16x32768,8x16x16x4096,8x8x8x32768,32x128x16x4096
for n in main $WS ws8; do wv $n timeout 120 python3 bench/kernel_bench.py --kdtree-only --shapes $SH --out $R/$n.json > $R/$n.bench.log 2>&1; echo "bench $n rc $?"; done
python3 bench/compare_runs.py $R/main.json $R/$WS.json $R/ws8.json | tee $R/compare.txt
P="python3 bench/profile_kernel.py --batch 1 --heads 128 --draft 16 --prefix 32768"
wv $WS timeout 150 ncu --clock-control none --kernel-name regex:attention_kernel --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" $P > $R/ncu_ws.log 2>&1; echo "ncu rc $?"
wv $WS timeout 150 ncu --clock-control none --kernel-name regex:attention_kernel --launch-skip 2 --launch-count 1 \
  --section SourceCounters --import-source yes -o $R/src_ws $P > /dev/null 2>&1; echo "ncu src rc $?"
ncu -i $R/src_ws.ncu-rep --page source --csv --print-source sass > $R/sass_ws.csv; rm -f $R/src_ws.ncu-rep
grep -E "Duration|Eligible Warps|Warp Cycles Per Issued|Registers Per|L1/TEX Cache Throughput|Compute \(SM\)" $R/ncu_ws.log
