#!/usr/bin/env bash
# Device command of run 51: run 50 again with the probe's Q stamp (variants/
# probe_q_on_main_811e23f.patch: run 32's patch on the shipped kernel d3e3bec, plus a stamp when
# thread 0's Q fragment loads have landed), L2 flushed and warm, at run 32's four small shapes.
set -uo pipefail
export KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
V=experiment_probe-warm
bash bench/ab_kernels.sh with $V python3 -m kdtree_verify._build > $OUT/probe.build.log 2>&1; tail -1 $OUT/probe.build.log
for l2 in flushed warm; do
  bash bench/ab_kernels.sh with $V timeout 120 python3 bench/probe_timeline.py --l2 $l2 > $OUT/probe_$l2.log 2>&1
  echo "probe $l2 rc $?"
done
