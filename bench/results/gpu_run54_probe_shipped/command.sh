#!/usr/bin/env bash
# Device command of run 54: the timeline probe with the Q stamp on the shipped kernel
# (variants/probe_q_on_main_69bbddf.patch: run 51's probe on main 69bbddf, kernel 33e6a04, where Q
# goes through shared memory), L2 flushed and warm, at run 32's four small shapes.
set -uo pipefail
export KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
bash bench/ab_kernels.sh with experiment_probe-shipped python3 -m kdtree_verify._build 2>&1 | tail -1
bash bench/ab_kernels.sh with experiment_probe-shipped timeout 200 python3 bench/probe_timeline.py \
  --l2 flushed warm > $OUT/probe.log 2>&1
echo "probe rc $?"
