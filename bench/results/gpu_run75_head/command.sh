#!/usr/bin/env bash
# Device command of run 75: main at bfcfa36 (7d605df plus -rs in bench/gpu_session.sh). The two
# mends after run 74 (the test bounds moved to kdtree_verify.testing, the plan's workspace device
# checked by check_kernel_layout) had not run on a GPU. Every GPU test (kernel, backend, engine),
# then the three sanitizers over tests/gpu/kernel_sanitize_cases.py, through bench/gpu_session.sh
# as bench/README documents it.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
for mode in test sanitize; do
  OUT=$OUT/$mode timeout 280 bench/gpu_session.sh $mode > $OUT/$mode.log 2>&1
  echo "$mode rc $? at ${SECONDS}s"
done
grep -E "passed|failed" $OUT/test/test.log | tail -1
grep -h "SKIPPED" $OUT/test/test.log
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" $OUT/sanitize/sanitize_*.log
tar -czf $OUT/session.tgz -C $OUT test sanitize && rm -rf $OUT/test $OUT/sanitize
