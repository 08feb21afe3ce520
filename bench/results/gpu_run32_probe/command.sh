#!/usr/bin/env bash
# Device command of run 32: the timeline probe on main after the PDL launches and TileMeta.
set -uo pipefail
export KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
mkdir -p $OUT/r
PYTHONPATH=$PWD/ab_probe/probe/kernel KDTREE_BUILD_DIR=/tmp/ab-build/probe python3 -m kdtree_verify._build > $OUT/r/probe.build.log 2>&1; tail -1 $OUT/r/probe.build.log
PYTHONPATH=$PWD/ab_probe/probe/kernel:$PWD/services/inference KDTREE_BUILD_DIR=/tmp/ab-build/probe python3 ab_probe/tools/probe_timeline.py 2>&1 | tee $OUT/r/probe.log
