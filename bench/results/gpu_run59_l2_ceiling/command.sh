#!/usr/bin/env bash
# Device command of run 59: the H200's L2 read ceiling (bench/l2_ceiling.py), to compare with the
# L2-to-SM traffic of the verify kernel and of run 58's ablations; and the unit test of the tool
# on a GPU.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $OUT/gpu.txt
python3 bench/l2_ceiling.py --out $OUT/l2_ceiling.json > $OUT/l2_ceiling.log 2>&1; echo "l2_ceiling rc $?"
cat $OUT/l2_ceiling.log
python3 -m pytest -q -p no:cacheprovider tests/unit/test_l2_ceiling.py -o addopts="" > $OUT/test.log 2>&1
echo "test rc $?: $(tail -n 1 $OUT/test.log)"
