#!/usr/bin/env bash
# Device command of run 69: main at b01c48e (the kernel tests share one reference assertion): the
# kernel GPU tests, then the benchmark with every contender at the top of SGLang's prefix range
# (200k tokens), beyond the grid.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs:$PWD/kernel:$PWD/services/inference KDTREE_CUDA_ARCHS=90
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
python3 -m kdtree_verify._build > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "built at ${SECONDS}s"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" > $OUT/test_kernel.log 2>&1
echo "test_kernel rc $?: $(tail -1 $OUT/test_kernel.log) at ${SECONDS}s"
timeout 300 python3 bench/kernel_bench.py --out $OUT/h200_200k.json \
  --shapes 1x8x8x200000,1x8x16x200000,1x16x16x200000,1x128x16x200000,8x16x16x200000 > $OUT/h200_200k.log 2>&1
echo "bench rc $? at ${SECONDS}s"
tail -n 8 $OUT/h200_200k.log
