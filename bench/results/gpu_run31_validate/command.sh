#!/usr/bin/env bash
# Device command of run 31: main with the PDL launches and the TileMeta table: every GPU test,
# then our kernel alone over the whole grid (81 shapes; no Triton baselines).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run31; mkdir -p $R; trap 'tar -czf $OUT/run31.tgz -C /tmp run31' EXIT
OUT=$R bash bench/gpu_session.sh test; rc=$?
export PYTHONPATH=$PYTHONPATH:$PWD/kernel:$PWD/services/inference
timeout 330 python3 bench/kernel_bench.py --kdtree-only --out $R/h200_kdtree_only.json 2>&1 | tee $R/bench_kdtree_only.log | tail -4
exit $rc
