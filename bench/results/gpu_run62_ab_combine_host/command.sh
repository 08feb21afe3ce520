#!/usr/bin/env bash
# Device command of run 62. A/B of main (kernel 33e6a04) against experiment/combine-host: the
# combine kernel in two batch sizes, the host taking 9 splits per warp per round (a row's <= 72
# splits in one round of loads, one CTA per SM) where the T_total x H rows fit one wave of it,
# else main's 4. The variant's kernel tests, then three interleaved kdtree-only passes over the
# whole grid.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
AB_TESTS=test AB_TEST_VARIANTS="experiment_combine-host" AB_REPEATS=3 OUT=$OUT \
  timeout 560 bash bench/ab_kernels.sh run
echo "ab_kernels rc $? at ${SECONDS}s"
