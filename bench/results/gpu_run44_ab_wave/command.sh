#!/usr/bin/env bash
# Device command of run 44: main (f29b49b) against wave (d3e3bec: the plan's split size keeps the
# attention CTAs to one wave). The kernel GPU tests for wave; both timed kdtree-only over the whole
# grid twice (main, wave, main, wave); then, if wave passed, the benchmark of record for wave
# (every contender) over as much of the grid as the command's time allows.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$PWD/.triton-cache
R=/tmp/run44; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
wv() { local n=$1; shift; PYTHONPATH=$PWD/ab/$n/kernel:$PWD/services/inference:$PYTHONPATH KDTREE_BUILD_DIR=/tmp/ab-build/$n "$@"; }
V="main wave"
for n in $V; do wv $n python3 -m kdtree_verify._build > $R/$n.build.log 2>&1 & done; wait
tail -n1 $R/*.build.log; echo "built at ${SECONDS}s"
wv wave timeout 170 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" > $R/wave.test.log 2>&1; trc=$?
echo "wave test rc $trc: $(tail -1 $R/wave.test.log) at ${SECONDS}s"
for rep in 1 2; do for n in $V; do
  wv $n timeout 60 python3 bench/kernel_bench.py --kdtree-only --out $R/$n.$rep.json > $R/$n.$rep.bench.log 2>&1; echo "bench $n $rep rc $? at ${SECONDS}s"
done; done
for rep in 1 2; do python3 bench/compare_runs.py $R/main.$rep.json $R/wave.$rep.json > $R/compare.$rep.txt; done
python3 bench/compare_runs.py $R/main.1.json $R/main.2.json > $R/compare.main_vs_main.txt
tail -n 4 $R/compare.*.txt
tar -czf $OUT/run44_ab.tgz -C /tmp run44; cp $R/compare.1.txt $R/compare.2.txt $OUT/
if [[ $trc == 0 ]]; then
  left=$((570 - SECONDS)); echo "record: ${left}s"
  wv wave timeout $left python3 bench/kernel_bench.py --out $OUT/record_a.json > $OUT/record_a.log 2>&1
  echo "record rc $? at ${SECONDS}s"
fi
