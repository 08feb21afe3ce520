#!/usr/bin/env bash
# Device command of run 68: main at da773a1 (one dtype dispatch behind the three host entry
# points) plus five new kernel tests beyond the sweep (prefixes of 200k, T of 100 and 128): all
# GPU tests, then compute-sanitizer memcheck over the sanitizer cases.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs:$PWD/kernel:$PWD/services/inference KDTREE_CUDA_ARCHS=90
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
python3 -m kdtree_verify._build > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "built at ${SECONDS}s"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu -o addopts="" --durations=8 > $OUT/test_gpu.log 2>&1
echo "tests/gpu rc $?: $(grep -E '^[0-9]+ (passed|failed)|passed|failed' $OUT/test_gpu.log | tail -1) at ${SECONDS}s"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py > $OUT/sanitize_memcheck.log 2>&1
echo "memcheck rc $?: $(tail -1 $OUT/sanitize_memcheck.log) at ${SECONDS}s"
