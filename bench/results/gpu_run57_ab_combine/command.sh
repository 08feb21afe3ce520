#!/usr/bin/env bash
# Device command of run 57. A/B of main (kernel 33e6a04) against two combine kernels that fetch a
# row's split partials in fewer dependent rounds: experiment/combine-b9 (8 warps, 9 splits per
# warp per round: 72) and experiment/combine-w16 (16 warps, 5 per round: 80); main takes 32 per
# round, so B=1 calls with 65 splits need two. The variants' kernel tests, then three interleaved
# kdtree-only passes over the whole grid.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
AB_TESTS=test AB_TEST_VARIANTS="experiment_combine-b9 experiment_combine-w16" AB_REPEATS=3 OUT=$OUT \
  bash bench/ab_kernels.sh run
echo "ab_kernels rc $? at ${SECONDS}s"
