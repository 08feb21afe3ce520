#!/usr/bin/env bash
# Device command of run 72, on two H200s (nvidia-h200-x2): the op on cuda:1 after cuda:0 in one
# process (tests/gpu/two_devices.py), before (2640729: the dynamic shared-memory opt-in set once
# per process) and after (main 5da2abd: once per device) the fix; then all GPU tests of the fix,
# where the two-device test runs instead of skipping.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,driver_version --format=csv > $OUT/gpu.txt
for v in 2640729 main; do
  bash bench/ab_kernels.sh with $v python3 -m kdtree_verify._build > $OUT/$v.build.log 2>&1 || { tail -5 $OUT/$v.build.log; exit 1; }
  timeout 120 bash bench/ab_kernels.sh with $v python3 ab/$v/tests/gpu/two_devices.py > $OUT/$v.two_devices.log 2>&1
  echo "$v two_devices rc $? at ${SECONDS}s: $(tail -1 $OUT/$v.two_devices.log)"
done
timeout 240 bash bench/ab_kernels.sh with main python3 -m pytest -q -p no:cacheprovider ab/main/tests/gpu -o addopts="" -rs > $OUT/test_gpu.log 2>&1
echo "tests/gpu rc $? at ${SECONDS}s: $(tail -1 $OUT/test_gpu.log)"
