# Device command: compute-sanitizer on the warp-specialized branch (cc51700): memcheck, synccheck
# (barrier use across the two warp roles) and racecheck (shared-memory hazards between them) over
# tests/gpu/kernel_sanitize_cases.py.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD/ab/experiment_warp-specialized/kernel:$PWD/services/inference:/tmp/site:$PWD/.stubs
export KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1 KDTREE_BUILD_DIR=/tmp/ab-build/ws
R=/tmp/run25; mkdir -p $R; trap 'tar -czf $OUT/run25.tgz -C /tmp run25' EXIT
python3 -m kdtree_verify._build > $R/build.log 2>&1; tail -1 $R/build.log
rc=0
for tool in memcheck synccheck racecheck; do
  timeout 200 compute-sanitizer --tool $tool --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py > $R/$tool.log 2>&1
  r=$?; rc=$((rc | r)); echo "$tool rc $r"; tail -2 $R/$tool.log
done
exit $rc
