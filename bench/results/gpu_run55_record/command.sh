#!/usr/bin/env bash
# Device command of run 55: the benchmark of record for the shipped kernel (33e6a04, Q through
# shared memory), every contender, over as much of the grid as one command's time allows. The
# Triton cache lives in the tree (an ignored path a warm machine keeps) so that run 56, issued
# while the machine is warm, finds it.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs:$PWD/kernel:$PWD/services/inference KDTREE_CUDA_ARCHS=90
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.triton-cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $OUT/gpu.txt
python3 -m kdtree_verify._build > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "built at ${SECONDS}s"
left=$((585 - SECONDS))
timeout $left python3 bench/kernel_bench.py --out $OUT/record_a.json > $OUT/record_a.log 2>&1
echo "record rc $? at ${SECONDS}s; $(grep -c '^B=' $OUT/record_a.log) shapes"
tail -n 3 $OUT/record_a.log
