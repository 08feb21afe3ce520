#!/usr/bin/env bash
# Device command of run 36: the plan written by all threads (branch experiment/plan-warp-writes-2,
# a946227): the kernel GPU tests, memcheck, then parts 1 and 2 of 3 of the benchmark of record
# (every contender).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.stubs:$PWD/kernel:$PWD/services/inference KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run36; mkdir -p $R; pack() { tar -czf $OUT/run36.tgz -C /tmp run36; }; trap pack EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
python3 -m kdtree_verify._build 2>&1 | tail -1 | tee $R/build.log
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" > $R/test_kernel.log 2>&1; echo "tests rc=$?"; tail -1 $R/test_kernel.log
timeout 45 compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py > $R/sanitize_memcheck.log 2>&1; echo "memcheck rc=$?"; tail -1 $R/sanitize_memcheck.log; pack
for part in 1 2; do
  timeout 200 python3 bench/kernel_bench.py --part $part/3 --out $R/h200_part$part.json > $R/bench_part$part.log 2>&1; echo "part $part rc=$?"; tail -2 $R/bench_part$part.log; pack
done
