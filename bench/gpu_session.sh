#!/usr/bin/env bash
# One GPU-machine session: build the kernel for the local GPU, run the GPU tests, the memcheck
# subset and the benchmark, keeping every raw log under $OUT (default bench/results/run).
# Usage (on the GPU machine, repo root): bench/gpu_session.sh [all|test|sanitize|bench|quick|serving|profile]
# serving: the SGLang-backend and reference-engine GPU tests, the layer benchmark and the engine's
# op-vs-triton parity over 100 prompts (issues 4 and 5). profile: Nsight Compute on the attention
# kernel at B=1, H=8, T=8, prefix 32k (where the time goes; see bench/README.md).
set -uo pipefail
what=${1:-all}
OUT=${OUT:-bench/results/run}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/kernel:$PWD/services/inference
export KDTREE_CUDA_ARCHS=${KDTREE_CUDA_ARCHS:-$(python3 -c 'import torch; p = torch.cuda.get_device_capability(); print(f"{p[0]}{p[1]}")')}
rc=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv | tee "$OUT/gpu.txt"
python3 -m kdtree_verify._build 2>&1 | tail -5 | tee "$OUT/build.log" || exit 1
if [[ $what == all || $what == test ]]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu -o addopts="" --durations=10 2>&1 | tee "$OUT/test.log"
  rc=$((rc | ${PIPESTATUS[0]}))
fi
if [[ $what == all || $what == sanitize ]]; then
  compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py 2>&1 | tail -30 | tee "$OUT/sanitize.log"
  rc=$((rc | ${PIPESTATUS[0]}))
fi
if [[ $what == all || $what == bench ]]; then
  python3 bench/kernel_bench.py --out "$OUT/h200.json" 2>&1 | tee "$OUT/bench.log"
  rc=$((rc | ${PIPESTATUS[0]}))
fi
if [[ $what == quick ]]; then
  python3 bench/kernel_bench.py --quick --out "$OUT/quick.json" 2>&1 | tee "$OUT/bench_quick.log"
  rc=$((rc | ${PIPESTATUS[0]}))
fi
if [[ $what == serving ]]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_backend_gpu.py tests/gpu/test_engine_gpu.py -o addopts="" --durations=10 2>&1 | tee "$OUT/serving_test.log"
  rc=$((rc | ${PIPESTATUS[0]}))
  python3 bench/layer_bench.py --out "$OUT/layer_h200.json" 2>&1 | tee "$OUT/layer_bench.log"
  rc=$((rc | ${PIPESTATUS[0]}))
  python3 -m kdtree_inference.engine.gpu_parity --prompts 100 --out "$OUT/engine_gpu_parity.json" 2>&1 | tee "$OUT/engine_gpu_parity.log"
  rc=$((rc | ${PIPESTATUS[0]}))
fi
if [[ $what == profile ]]; then
  ncu --clock-control none --kernel-name regex:attention_kernel --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    python3 bench/profile_kernel.py --batch 1 --heads 8 --draft 8 --prefix 32768 2>&1 | tee "$OUT/ncu_attention.log"
  rc=$((rc | ${PIPESTATUS[0]}))
fi
exit $rc
