#!/usr/bin/env bash
# Device command of run 37: the kernel of run 36 (a946227): the 38 grid shapes that run 36's
# benchmark parts did not reach (every contender; a fresh machine compiles Triton's kernels first),
# then synccheck and racecheck, then the GPU tests outside test_kernel.py.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.stubs:$PWD/kernel:$PWD/services/inference KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run37; mkdir -p $R; pack() { tar -czf $OUT/run37.tgz -C /tmp run37; }; trap pack EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
python3 -m kdtree_verify._build 2>&1 | tail -1 | tee $R/build.log
S=8x128x32x4096,32x8x8x4096,32x8x16x4096,32x8x32x4096,32x16x8x4096,32x16x16x4096,32x16x32x4096,32x128x8x4096,32x128x16x4096,32x128x32x4096,32x128x32x32768
S=$S,1x8x8x131072,1x8x16x131072,1x8x32x131072,1x16x8x131072,1x16x16x131072,1x16x32x131072,1x128x8x131072,1x128x16x131072,1x128x32x131072,8x8x8x131072,8x8x16x131072,8x8x32x131072,8x16x8x131072,8x16x16x131072,8x16x32x131072,8x128x8x131072,8x128x16x131072,8x128x32x131072
S=$S,32x8x8x131072,32x8x16x131072,32x8x32x131072,32x16x8x131072,32x16x16x131072,32x16x32x131072,32x128x8x131072,32x128x16x131072,32x128x32x131072
timeout 380 python3 bench/kernel_bench.py --shapes $S --out $R/h200_part3.json > $R/bench_part3.log 2>&1; echo "part 3 rc=$?"; grep -c kdtree $R/bench_part3.log; pack
for tool in synccheck racecheck; do
  timeout 35 compute-sanitizer --tool $tool --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py > $R/sanitize_$tool.log 2>&1; echo "$tool rc=$?"; tail -1 $R/sanitize_$tool.log; pack
done
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu -o addopts="" --ignore=tests/gpu/test_kernel.py > $R/test_rest.log 2>&1; echo "rest rc=$?"; tail -1 $R/test_rest.log
