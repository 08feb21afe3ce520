#!/usr/bin/env bash
# Device command of run 53: the shipped code after Q through shared memory (main, kernel from the
# working tree): all GPU tests and compute-sanitizer memcheck, racecheck and synccheck.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs:$PWD/kernel:$PWD/services/inference KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run53; mkdir -p $R; pack() { tar -czf $OUT/run53.tgz -C /tmp run53; }; trap pack EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
python3 -m kdtree_verify._build 2>&1 | tail -1 | tee $R/build.log; echo "built at ${SECONDS}s"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu -o addopts="" > $R/test_gpu.log 2>&1
echo "tests/gpu rc $?: $(tail -1 $R/test_gpu.log) at ${SECONDS}s"; pack
for tool in memcheck racecheck synccheck; do
  timeout 60 compute-sanitizer --tool $tool --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py > $R/sanitize_$tool.log 2>&1
  echo "$tool rc $?: $(tail -1 $R/sanitize_$tool.log) at ${SECONDS}s"
done
