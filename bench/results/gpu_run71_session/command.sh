#!/usr/bin/env bash
# Device command of run 71: bench/README's reproduction path as a newcomer runs it (the wheels,
# PYTHONPATH, then bench/gpu_session.sh), last exercised in run 31: the sanitize, quick and
# serving modes on main (af0f7be), each into its own $OUT folder.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.stubs
for mode in sanitize quick serving; do
  OUT=$OUT/$mode timeout 240 bench/gpu_session.sh $mode > $OUT/$mode.log 2>&1
  echo "$mode rc $? at ${SECONDS}s"
done
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" $OUT/sanitize/sanitize_*.log
tail -n 4 $OUT/quick/bench_quick.log
grep -E "passed|failed" $OUT/serving/serving_test.log | tail -1
tail -n 3 $OUT/serving/layer_bench.log; tail -n 2 $OUT/serving/engine_gpu_parity.log
# The machine returns a handful of files: pack the three modes' folders.
tar -czf $OUT/session.tgz -C $OUT sanitize quick serving && rm -rf $OUT/sanitize $OUT/quick $OUT/serving
