#!/usr/bin/env bash
# Device command of run 47: bench/ab_kernels.sh run as changed (each variant's own GPU tests,
# AB_TEST_VARIANTS, AB_REPEATS), on a small case: main and experiment/work-list, the work list's
# plan and graph tests from its own test file, two timing passes over two shapes.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90
AB_TESTS="plan_splits or graph" AB_TEST_VARIANTS=experiment_work-list AB_REPEATS=2 \
  AB_BENCH_ARGS="--shapes 1x8x8x4096,8x8x8x4096" OUT=$OUT bash bench/ab_kernels.sh run
echo "ab_kernels rc $?"
