#!/usr/bin/env bash
# Device command of run 50: the timeline probe (variants/probe_on_main_811e23f.patch: run 32's
# patch on the shipped kernel d3e3bec) at run 32's four small shapes, with the L2 flushed before
# each call (as the benchmark times it) and warm (no flush: run 49 timed B=1, H=8, T=8, 4k at
# 12.8 µs per layer call that way, against 15.5 flushed).
set -uo pipefail
export KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
V=experiment_probe-warm
bash bench/ab_kernels.sh with $V python3 -m kdtree_verify._build > $OUT/probe.build.log 2>&1; tail -1 $OUT/probe.build.log
for l2 in flushed warm; do
  bash bench/ab_kernels.sh with $V timeout 120 python3 bench/probe_timeline.py --l2 $l2 > $OUT/probe_$l2.log 2>&1
  echo "probe $l2 rc $?"
done
