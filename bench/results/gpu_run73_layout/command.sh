#!/usr/bin/env bash
# Device command of run 73: main at the layout refusals of kdtree_verify.cuda (check_kernel_layout)
# and their GPU test: all GPU tests (the two-device one skips on this one-GPU machine; run 72 ran
# it on two).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs:$PWD/kernel:$PWD/services/inference KDTREE_CUDA_ARCHS=90
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
python3 -m kdtree_verify._build > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "built at ${SECONDS}s"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu -o addopts="" -rs > $OUT/test_gpu.log 2>&1
echo "tests/gpu rc $? at ${SECONDS}s: $(tail -1 $OUT/test_gpu.log)"
grep SKIPPED $OUT/test_gpu.log
