#!/usr/bin/env bash
# Device command of run 63: the shipped code after the host-chosen combine batch (main, kernel
# from the working tree): all GPU tests, compute-sanitizer memcheck over the sanitizer cases (the
# combine is the only kernel that changed; its wide batch is new on the shipped path), then the
# benchmark of record with every contender over as much of the grid as the command's time allows.
# The Triton cache lives in the tree (an ignored path a warm machine keeps) for run 64.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs:$PWD/kernel:$PWD/services/inference KDTREE_CUDA_ARCHS=90
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.triton-cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $OUT/gpu.txt
python3 -m kdtree_verify._build > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "built at ${SECONDS}s"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu -o addopts="" > $OUT/test_gpu.log 2>&1
echo "tests/gpu rc $?: $(tail -1 $OUT/test_gpu.log) at ${SECONDS}s"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py > $OUT/sanitize_memcheck.log 2>&1
echo "memcheck rc $?: $(tail -1 $OUT/sanitize_memcheck.log) at ${SECONDS}s"
left=$((585 - SECONDS))
timeout $left python3 bench/kernel_bench.py --out $OUT/record_a.json > $OUT/record_a.log 2>&1
echo "record rc $? at ${SECONDS}s; $(grep -c '^B=' $OUT/record_a.log) shapes"
tail -n 3 $OUT/record_a.log
