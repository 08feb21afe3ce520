#!/usr/bin/env bash
# Device command of run 48. A/B of main (7bbc612) against experiment/prologue2 (the prologue
# loads KV tiles 0 and 1 together) and experiment/first-idx (that, plus the plan copying each
# CTA's first 64 prefix indices next to its schedule): prologue2's kernel tests, two interleaved
# kdtree-only passes over the whole grid; then first-idx's whole GPU suite (backend graph tests
# included), memcheck and racecheck.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
AB_TESTS=test AB_TEST_VARIANTS=experiment_prologue2 AB_REPEATS=2 OUT=$OUT bash bench/ab_kernels.sh run
echo "ab_kernels rc $? at ${SECONDS}s"
fi() { bash bench/ab_kernels.sh with experiment_first-idx "$@"; }
fi timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu -o addopts="" > $OUT/fi.test_gpu.log 2>&1
echo "first-idx tests/gpu rc $?: $(tail -1 $OUT/fi.test_gpu.log) at ${SECONDS}s"
for tool in memcheck racecheck; do
  fi timeout 60 compute-sanitizer --tool $tool --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py > $OUT/fi.$tool.log 2>&1
  echo "first-idx $tool rc $?: $(tail -1 $OUT/fi.$tool.log) at ${SECONDS}s"
done
