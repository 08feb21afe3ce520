#!/usr/bin/env bash
# Device command of run 67: the shipped code at cac088d (one per-device cache serves the PDL and
# combine-batch queries; not yet run on a GPU) plus a new GPU test that first launches every
# kernel inside a CUDA-graph capture (tests/gpu/capture_cold_start.py): all GPU tests, then
# compute-sanitizer memcheck over the sanitizer cases and over the cold-capture script.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs:$PWD/kernel:$PWD/services/inference KDTREE_CUDA_ARCHS=90
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.triton-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt
python3 -m kdtree_verify._build > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "built at ${SECONDS}s"
python3 tests/gpu/capture_cold_start.py > $OUT/capture_cold_start.log 2>&1
echo "cold capture rc $?: $(tail -1 $OUT/capture_cold_start.log) at ${SECONDS}s"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu -o addopts="" > $OUT/test_gpu.log 2>&1
echo "tests/gpu rc $?: $(tail -1 $OUT/test_gpu.log) at ${SECONDS}s"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py > $OUT/sanitize_memcheck.log 2>&1
echo "memcheck rc $?: $(tail -1 $OUT/sanitize_memcheck.log) at ${SECONDS}s"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/gpu/capture_cold_start.py > $OUT/sanitize_memcheck_capture.log 2>&1
echo "memcheck (cold capture) rc $?: $(tail -1 $OUT/sanitize_memcheck_capture.log) at ${SECONDS}s"
