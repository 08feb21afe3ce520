#!/usr/bin/env bash
# Device command of run 46. (1) The shipped code, main 4172797 (kernel d3e3bec): the whole GPU
# suite and compute-sanitizer memcheck, synccheck and racecheck. (2) experiment/work-list (71ce8bd):
# its 93 kernel GPU tests and memcheck, and main and it timed kdtree-only over the whole grid twice
# (main, wl, main, wl).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run46; mkdir -p $R; pack() { tar -czf $OUT/run46.tgz -C /tmp run46; }; trap pack EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
wv() { local n=$1; shift; PYTHONPATH=$PWD/ab/$n/kernel:$PWD/services/inference:$PYTHONPATH KDTREE_BUILD_DIR=/tmp/ab-build/$n "$@"; }
for n in main wl; do wv $n python3 -m kdtree_verify._build > $R/$n.build.log 2>&1 & done; wait
tail -n1 $R/*.build.log; echo "built at ${SECONDS}s"
wv main timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu -o addopts="" > $R/main.test_gpu.log 2>&1
echo "main tests/gpu rc $?: $(tail -1 $R/main.test_gpu.log) at ${SECONDS}s"; pack
for tool in memcheck synccheck racecheck; do
  wv main timeout 45 compute-sanitizer --tool $tool --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py > $R/main.sanitize_$tool.log 2>&1
  echo "main $tool rc $?: $(tail -1 $R/main.sanitize_$tool.log) at ${SECONDS}s"
done; pack
wv wl timeout 120 python3 -m pytest -q -p no:cacheprovider ab/wl/tests_gpu/test_kernel.py -o addopts="" > $R/wl.test.log 2>&1; trc=$?
echo "wl test rc $trc: $(tail -1 $R/wl.test.log) at ${SECONDS}s"
wv wl timeout 45 compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py > $R/wl.sanitize_memcheck.log 2>&1
echo "wl memcheck rc $?: $(tail -1 $R/wl.sanitize_memcheck.log) at ${SECONDS}s"; pack
for rep in 1 2; do for n in main wl; do
  wv $n timeout 60 python3 bench/kernel_bench.py --kdtree-only --out $R/$n.$rep.json > $R/$n.$rep.bench.log 2>&1; echo "bench $n $rep rc $? at ${SECONDS}s"
done; done
for rep in 1 2; do python3 bench/compare_runs.py $R/main.$rep.json $R/wl.$rep.json > $R/compare.$rep.txt; done
python3 bench/compare_runs.py $R/main.1.json $R/main.2.json > $R/compare.main_vs_main.txt
tail -n 3 $R/compare.*.txt; cp $R/compare.1.txt $R/compare.2.txt $OUT/
