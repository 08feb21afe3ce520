# Device command: A/B main vs experiment/bulk-copy (full kernel GPU tests for both), then memcheck
# of the bulk-copy variant.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run17; mkdir -p $R
OUT=$R AB_TESTS="not nothing" bash bench/ab_kernels.sh run; rc=$?
PYTHONPATH=$PWD/ab/experiment_bulk-copy/kernel:$PWD/services/inference:$PYTHONPATH KDTREE_BUILD_DIR=/tmp/ab-build/experiment_bulk-copy \
  compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py > $R/sanitize_bulk.log 2>&1; rc=$((rc | $?))
tail -4 $R/sanitize_bulk.log
tar -czf $OUT/run17.tgz -C /tmp run17
exit $rc
