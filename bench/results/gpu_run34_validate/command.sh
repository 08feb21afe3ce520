#!/usr/bin/env bash
# Device command of run 34: main (PDL launches, TileMeta, own S share in registers): the kernel
# GPU tests, the three compute-sanitizer tools, our kernel alone over the whole grid, then the
# rest of the GPU tests.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.stubs:$PWD/kernel:$PWD/services/inference KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run34; mkdir -p $R; pack() { tar -czf $OUT/run34.tgz -C /tmp run34; }; trap pack EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
python3 -m kdtree_verify._build 2>&1 | tail -1 | tee $R/build.log
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" > $R/test_kernel.log 2>&1; rc=$?; tail -1 $R/test_kernel.log; pack
for tool in memcheck synccheck racecheck; do
  timeout 45 compute-sanitizer --tool $tool --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py > $R/sanitize_$tool.log 2>&1; echo "$tool rc=$?"; tail -1 $R/sanitize_$tool.log; pack
done
timeout 75 python3 bench/kernel_bench.py --kdtree-only --out $R/h200_kdtree_only.json > $R/bench_kdtree_only.log 2>&1; echo "bench rc=$?"; grep -A6 '"summary"' $R/h200_kdtree_only.json; pack
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu -o addopts="" --ignore=tests/gpu/test_kernel.py > $R/test_rest.log 2>&1; echo "rest rc=$?"; tail -1 $R/test_rest.log
exit $rc
