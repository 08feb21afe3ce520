#!/usr/bin/env bash
# Device command of run 52. A/B of main (kernel d3e3bec) against experiment/q-smem (Q copied to
# shared memory in 16-byte pieces, then ldmatrix, instead of 72 scattered 4-byte loads per thread)
# and experiment/o-smem (q-smem, plus the epilogue's fp32 partial staged in shared memory and
# written in whole rows): q-smem's kernel tests, two interleaved kdtree-only passes over the whole
# grid; then o-smem's whole GPU suite, memcheck and racecheck.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
AB_TESTS=test AB_TEST_VARIANTS=experiment_q-smem AB_REPEATS=2 OUT=$OUT bash bench/ab_kernels.sh run
echo "ab_kernels rc $? at ${SECONDS}s"
osmem() { bash bench/ab_kernels.sh with experiment_o-smem "$@"; }
osmem timeout 150 python3 -m pytest -q -p no:cacheprovider ab/experiment_o-smem/tests/gpu -o addopts="" > $OUT/osmem.test_gpu.log 2>&1
echo "o-smem tests/gpu rc $?: $(tail -1 $OUT/osmem.test_gpu.log) at ${SECONDS}s"
for tool in memcheck racecheck; do
  osmem timeout 60 compute-sanitizer --tool $tool --error-exitcode 1 python3 ab/experiment_o-smem/tests/gpu/kernel_sanitize_cases.py > $OUT/osmem.$tool.log 2>&1
  echo "o-smem $tool rc $?: $(tail -1 $OUT/osmem.$tool.log) at ${SECONDS}s"
done
