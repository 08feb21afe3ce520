# Device command: the warp-specialized branch with non-.aligned barriers: synccheck, racecheck,
# and a smoke subset of the kernel GPU tests.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD/ab/experiment_warp-specialized/kernel:$PWD/services/inference:/tmp/site:$PWD/.stubs
export KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1 KDTREE_BUILD_DIR=/tmp/ab-build/ws
R=/tmp/run27; mkdir -p $R; trap 'tar -czf $OUT/run27.tgz -C /tmp run27' EXIT
python3 -m kdtree_verify._build > $R/build.log 2>&1; tail -1 $R/build.log
rc=0
for tool in synccheck racecheck; do
  timeout 60 compute-sanitizer --tool $tool --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py > $R/$tool.log 2>&1
  r=$?; rc=$((rc | r)); echo "$tool rc $r: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $R/$tool.log | head -1)"
done
timeout 40 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" -k "ragged_draft or late_score or graph or variants" > $R/test.log 2>&1; r=$?; rc=$((rc | r)); echo "smoke rc $r: $(tail -1 $R/test.log)"
exit $rc
