#!/usr/bin/env bash
# One GPU-machine session: build the kernel for the local GPU, run the GPU tests, the sanitizers
# (memcheck, synccheck, racecheck) over a case subset and the benchmark, keeping every raw log
# under $OUT (default bench/results/run).
# Usage (on the GPU machine, repo root):
#   bench/gpu_session.sh [all|test|sanitize|bench|quick|serving|profile|tune|fp8]
# serving: the SGLang-backend and reference-engine GPU tests, the layer benchmark and the engine's
# op-vs-triton parity over 100 prompts. profile: Nsight Compute on the attention
# kernel at a memory-bound shape (B=1, H=8, T=8, 32k) and a compute-bound one (B=1, H=128, T=16,
# 32k): stall reasons, per-instruction samples split into main-loop phases (bench/kdtree_bench/profiling/stall_phases.py),
# and the duration of each of the three kernels of one call. tune: the kernel tests, our
# kernel alone over the whole grid (no baselines; its ceilings include the mma.sync one) and the
# profile: one kernel-tuning iteration. fp8: the fp8 KV pool in one bounded pass (under 8
# minutes on an H200: the build, then at most 220 + 80 + 140 s): the kernel tests (bf16 and fp8,
# against the reference, the CPU op and SGLang's Triton fp8 path; CUDA graphs) and the backend's
# fp8 call path, memcheck over the fp8 sanitizer cases, and the fp8 benchmark
# (bench/kdtree_bench/kernel/kernel_bench.py --kv-dtype fp8: fp8 vs the bf16 pool vs Triton's fp8 path); each step
# under its own time limit, so a slow one cannot take the others' time.
set -uo pipefail
what=${1:-all}
OUT=${OUT:-bench/results/run}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/lib/settings:$PWD/kernel:$PWD/services/inference:$PWD/bench
export KDTREE_CUDA_ARCHS=${KDTREE_CUDA_ARCHS:-$(python3 -c 'import torch; p = torch.cuda.get_device_capability(); print(f"{p[0]}{p[1]}")')}
rc=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv | tee "$OUT/gpu.txt"
python3 -m kdtree_verify._build 2>&1 | tail -5 | tee "$OUT/build.log" || exit 1
if [[ $what == all || $what == test ]]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu -o addopts="" -rs --durations=10 2>&1 | tee "$OUT/test.log"
  rc=$((rc | PIPESTATUS[0]))
fi
if [[ $what == all || $what == sanitize ]]; then
  # memcheck: out-of-bounds and misaligned accesses; synccheck: barrier misuse; racecheck:
  # shared-memory hazards between warps.
  for tool in memcheck synccheck racecheck; do
    compute-sanitizer --tool "$tool" --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py 2>&1 \
      | tail -30 | tee "$OUT/sanitize_$tool.log"
    rc=$((rc | PIPESTATUS[0]))
  done
fi
if [[ $what == all || $what == bench ]]; then
  python3 -m kdtree_bench.kernel.kernel_bench --out "$OUT/h200.json" 2>&1 | tee "$OUT/bench.log"
  rc=$((rc | PIPESTATUS[0]))
fi
if [[ $what == quick ]]; then
  python3 -m kdtree_bench.kernel.kernel_bench --quick --out "$OUT/quick.json" 2>&1 | tee "$OUT/bench_quick.log"
  rc=$((rc | PIPESTATUS[0]))
fi
if [[ $what == serving ]]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_backend_gpu.py tests/gpu/test_engine_gpu.py -o addopts="" --durations=10 2>&1 | tee "$OUT/serving_test.log"
  rc=$((rc | PIPESTATUS[0]))
  python3 -m kdtree_bench.kernel.layer_bench --out "$OUT/layer_h200.json" 2>&1 | tee "$OUT/layer_bench.log"
  rc=$((rc | PIPESTATUS[0]))
  python3 -m kdtree_inference.engine.gpu_parity --prompts 100 --out "$OUT/engine_gpu_parity.json" 2>&1 | tee "$OUT/engine_gpu_parity.log"
  rc=$((rc | PIPESTATUS[0]))
fi
if [[ $what == tune ]]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py -o addopts="" 2>&1 | tail -15 | tee "$OUT/test_kernel.log"
  rc=$((rc | PIPESTATUS[0]))
  python3 -m kdtree_bench.kernel.kernel_bench --kdtree-only --out "$OUT/kdtree_only.json" 2>&1 | tee "$OUT/bench_kdtree_only.log"
  rc=$((rc | PIPESTATUS[0]))
fi
if [[ $what == fp8 ]]; then
  timeout 220 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernel.py tests/gpu/test_backend_fp8_gpu.py -o addopts="" -rs --durations=15 2>&1 | tee "$OUT/test_kernel.log"
  rc=$((rc | PIPESTATUS[0]))
  timeout 80 compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py --fp8 2>&1 \
    | tail -30 | tee "$OUT/sanitize_memcheck_fp8.log"
  rc=$((rc | PIPESTATUS[0]))
  timeout 140 python3 -m kdtree_bench.kernel.kernel_bench --kv-dtype fp8 --out "$OUT/h200_fp8.json" 2>&1 | tee "$OUT/bench_fp8.log"
  rc=$((rc | PIPESTATUS[0]))
fi
if [[ $what == profile || $what == tune ]]; then
  for shape in "1 8 8 32768" "1 128 16 32768"; do
    read -r b h t l <<<"$shape"
    ncu --clock-control none --kernel-name regex:attention_kernel --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      python3 -m kdtree_bench.profiling.profile_kernel --batch "$b" --heads "$h" --draft "$t" --prefix "$l" \
      >"$OUT/ncu_attention_B${b}_H${h}_T${t}_L${l}.log" 2>&1
    rc=$((rc | $?))
    # Per-SASS-instruction warp samples: bench/kdtree_bench/profiling/stall_phases.py sums them per main-loop phase.
    rep=$(mktemp -d)/src
    ncu --clock-control none --kernel-name regex:attention_kernel --launch-skip 2 --launch-count 1 \
      --section SourceCounters --import-source yes -o "$rep" \
      python3 -m kdtree_bench.profiling.profile_kernel --batch "$b" --heads "$h" --draft "$t" --prefix "$l" >/dev/null 2>&1
    ncu -i "$rep.ncu-rep" --page source --csv --print-source sass \
      >"$OUT/sass_B${b}_H${h}_T${t}_L${l}.csv" && python3 -m kdtree_bench.profiling.stall_phases "$OUT/sass_B${b}_H${h}_T${t}_L${l}.csv"
    rc=$((rc | $?))
    ncu --clock-control none --kernel-name regex:"plan_kernel|attention_kernel|combine_kernel" \
      --launch-skip 6 --launch-count 3 --section SpeedOfLight \
      python3 -m kdtree_bench.profiling.profile_kernel --batch "$b" --heads "$h" --draft "$t" --prefix "$l" 2>&1 \
      | grep -E "^  [a-z_ ]+|Duration" | tee "$OUT/ncu_kernels_B${b}_H${h}_T${t}_L${l}.log"
  done
  grep -h -E "Duration|Eligible Warps|Issued Warp|Warp Cycles Per Issued|Registers|Achieved Occ|DRAM Through|Compute \(SM\)" "$OUT"/ncu_attention_*.log
fi
exit $rc
