#!/usr/bin/env bash
# Device commands of run 80: the gather ceiling (bench/gather_ceiling.py: one CTA per SM gathering
# random 1152-B pool rows by cp.async and by bulk copies), compiled for the local GPU. Run twice on
# fresh machines: gather_ceiling.* with the first source, rerun_gather_ceiling.* with the committed
# one (its sm_80 guards leave the sm_90 code as it was).
set -uo pipefail
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
python3 bench/gather_ceiling.py --out $OUT/gather_ceiling.json 2>&1 | tee $OUT/gather_ceiling.log
