#!/usr/bin/env bash
# Device command of run 60: both ceiling tools through their shared command line
# (mma_ceiling.ceiling_cli, added after run 59), each with its unit tests on the GPU.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs PYTHONUNBUFFERED=1
for tool in l2_ceiling mma_ceiling; do
  python3 bench/$tool.py --out $OUT/$tool.json > $OUT/$tool.log 2>&1; echo "$tool rc $?"
  cat $OUT/$tool.log
  python3 -m pytest -q -p no:cacheprovider tests/unit/test_$tool.py -o addopts="" > $OUT/test_$tool.log 2>&1
  echo "test_$tool rc $?: $(tail -n 1 $OUT/test_$tool.log)"
done
