#!/usr/bin/env bash
# Device command of run 61. A/B of main (kernel 33e6a04) against experiment/pingpong: the two
# token-half groups of warps run half an iteration apart, so one group's S reduction and softmax
# overlap the other's MMAs (per-half loads; P-published and V-free named barriers between the
# groups). The variant's kernel tests (under a time limit: a barrier mistake would hang), then two
# interleaved kdtree-only passes over the whole grid.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
AB_TESTS=test AB_TEST_VARIANTS="experiment_pingpong" AB_REPEATS=2 OUT=$OUT \
  timeout 540 bash bench/ab_kernels.sh run
echo "ab_kernels rc $? at ${SECONDS}s"
