# Device command: main against the warp-specialized kernel with its loops unrolled over a round of
# stages, with two S accumulator sets (wsu) and with one (wsu1). Full kernel GPU tests for wsu, a
# smoke subset for wsu1, then all three timed on a few shapes.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run22; mkdir -p $R; trap 'tar -czf $OUT/run22.tgz -C /tmp run22; cp $R/compare.txt $OUT/ 2>/dev/null' EXIT
wv() { local n=$1; shift; PYTHONPATH=$PWD/ab/$n/kernel:$PWD/services/inference:$PYTHONPATH KDTREE_BUILD_DIR=/tmp/ab-build/$n "$@"; }
V="main wsu wsu1"
for n in $V; do wv $n python3 -m kdtree_verify._build > $R/$n.build.log 2>&1 & done; wait
tail -n1 $R/*.build.log
wv wsu timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" > $R/wsu.test.log 2>&1; echo "wsu test rc $?"; tail -1 $R/wsu.test.log
wv wsu1 timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" -k "ragged_draft or late_score or graph or variants" > $R/wsu1.test.log 2>&1; echo "wsu1 test rc $?"; tail -1 $R/wsu1.test.log
SH=1x8x8x4096,1x8x8x32768,1x8x16x32768,1x128x16x32768,8x16x16x4096,8x8x8x32768,32x128x16x4096,8x128x32x32768
for n in $V; do wv $n timeout 120 python3 bench/kernel_bench.py --kdtree-only --shapes $SH --out $R/$n.json > $R/$n.bench.log 2>&1; echo "bench $n rc $?"; done
python3 bench/compare_runs.py $R/main.json $R/wsu.json $R/wsu1.json | tee $R/compare.txt
P="python3 bench/profile_kernel.py --batch 1 --heads 128 --draft 16 --prefix 32768"
wv wsu timeout 150 ncu --clock-control none --kernel-name regex:attention_kernel --launch-skip 2 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section SchedulerStats --import-source yes -o $R/src_wsu $P > $R/ncu_wsu.log 2>&1; echo "ncu rc $?"
ncu -i $R/src_wsu.ncu-rep --page source --csv --print-source sass > $R/sass_wsu.csv
ncu -i $R/src_wsu.ncu-rep > $R/ncu_wsu_details.txt; rm -f $R/src_wsu.ncu-rep
