# Device command: compute-sanitizer synccheck and racecheck on main's kernel (never run before;
# memcheck is in gpu_run13_validate) and on the warp-specialized branch after its epilogue barrier
# fix (run 25 found that synccheck error), over tests/gpu/kernel_sanitize_cases.py.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1 KDTREE_CUDA_ARCHS=90
R=/tmp/run26; mkdir -p $R; trap 'tar -czf $OUT/run26.tgz -C /tmp run26' EXIT
wv() { local n=$1; shift; PYTHONPATH=$PWD/ab/$n/kernel:$PWD/services/inference:/tmp/site:$PWD/.stubs KDTREE_BUILD_DIR=/tmp/ab-build/$n "$@"; }
V="main experiment_warp-specialized"
for n in $V; do wv $n python3 -m kdtree_verify._build > $R/$n.build.log 2>&1 & done; wait
rc=0
for n in $V; do for tool in synccheck racecheck; do
  wv $n timeout 150 compute-sanitizer --tool $tool --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py > $R/$n.$tool.log 2>&1
  r=$?; rc=$((rc | r)); echo "$n $tool rc $r: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $R/$n.$tool.log | head -1)"
done; done
exit $rc
