#!/usr/bin/env bash
# Device command of run 74: main with the plan cache keyed per stream: the kernel's GPU tests.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs:$PWD/kernel:$PWD/services/inference KDTREE_CUDA_ARCHS=90
export PYTHONUNBUFFERED=1
python3 -m kdtree_verify._build > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "built at ${SECONDS}s"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" -rs > $OUT/test_kernel.log 2>&1
echo "test_kernel rc $? at ${SECONDS}s: $(tail -1 $OUT/test_kernel.log)"
