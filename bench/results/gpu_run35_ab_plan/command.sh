#!/usr/bin/env bash
# Device command of run 35: main against plan2 (the plan's row tiles written by a warp per
# request): the full kernel tests for both, our kernel alone over the whole grid for both (the
# JSONs carry kdtree_plan_us), memcheck of plan2 on the sanitizer cases.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
mkdir -p $OUT/r
AB_TESTS="not nothing" OUT=$OUT/r bash bench/ab_kernels.sh run 2>&1 | tee $OUT/r/ab.log
timeout 60 bash bench/ab_kernels.sh with plan2 compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py > $OUT/r/plan2.memcheck.log 2>&1; echo "memcheck rc=$?"; tail -2 $OUT/r/plan2.memcheck.log
