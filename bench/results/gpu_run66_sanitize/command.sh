#!/usr/bin/env bash
# Device command of run 66: compute-sanitizer synccheck and racecheck over the sanitizer cases on
# the shipped code (the host-chosen combine batch; run 63 ran memcheck and all GPU tests on it).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs:$PWD/kernel:$PWD/services/inference KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
python3 -m kdtree_verify._build > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "built at ${SECONDS}s"
for tool in synccheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py > $OUT/sanitize_$tool.log 2>&1
  echo "$tool rc $?: $(tail -1 $OUT/sanitize_$tool.log) at ${SECONDS}s"
done
