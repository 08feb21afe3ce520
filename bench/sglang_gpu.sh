#!/usr/bin/env bash
# bench/sglang_gpu.sh PHASE... -- real SGLang servers on the GPU machine, output under $OUT.
#
# Runs in the repo root there, with the SGLang payload carried as .sglsite (docs/development.md:
# ../shared/tools/sglang-gpu-site.sh .sglsite). The kdtree packages are installed from this tree
# as a user installs them (pip, no checkout on the path), so the kernel builds from the sources
# its wheel carries. Caches stay under /tmp so a warm machine reuses them.
#
# Phases:
#   tests        every GPU test but the end-to-end file (tests/gpu, against the installed packages
#                and SGLang's real code; TESTS_ONLY=FILE: the test ids listed there), then
#                `kdtree-selfcheck` as an operator runs it (its reports in $OUT/selfcheck)
#   correctness  tests/gpu/test_sglang_e2e.py per family in E2E_CONFIGS (eagle, eagle-fp8, dflash,
#                ddtree, ddtree-64, ddtree-rank, ddtree-rank-64, ddtree-kimi-16, ddtree-kimi-64,
#                ddtree-kimi, kimi; default eagle): validate == off, the parity gate (not the
#                ddtree-rank* and ddtree-kimi-16/-64 families: validate == off alone, four servers; the
#                ddtree-kimi families cap their pools and run at 0.5);
#                the families start at once, and each server takes its family's static fraction of
#                what the card has free (seven servers at 0.07-0.09 for the tiny ones): one tiny
#                family fits an H100, two did not; E2E_SEQUENTIAL=1 runs them one after another
#   speed        bench/kdtree_bench/e2e/sglang_e2e.py on the rank model (SPEED_PRESET), EAGLE or DFlash (SPEED_SPEC):
#                off vs on, batch 1/8, 1k/8k/32k prompts; the GPU's clocks, power and throttle
#                reasons every 200 ms beside it (speed/gpu_clocks.csv), lined up with each timed
#                repetition by bench/kdtree_bench/profiling/step_clocks.py (step_clocks.md)
#   tree         DDTree's tree step: tests/gpu/test_ddtree_tree_gpu.py, then
#                bench/kdtree_bench/profiling/ddtree_tree_bench.py (TREE_BENCH_ARGS, default budgets
#                8-64, batch 1 and 8, --memory 32), both under $OUT/tree (one archive)
#   kernel-bench bench/kdtree_bench/kernel/kernel_bench.py with KERNEL_BENCH_ARGS (e.g. --shapes
#                1x16x9x32768,1x16x65x32768 --kdtree-only: the kernel at DDTree's widths), its
#                table as kernel_bench.log, its record as kernel_bench.json
#   kernel-fp8   the FP8 kernel GPU tests (tests/gpu: test_kernel.py -k fp8, test_backend_fp8_gpu.py)
#   fp8-bench    memcheck over the fp8 sanitizer cases, then bench/kdtree_bench/kernel/kernel_bench.py --kv-dtype fp8
#                (fp8 pool vs bf16 pool vs SGLang's Triton fp8 path, from the payload's sglang)
#   smoke        bench/kdtree_bench/e2e/sglang_e2e.py on the tiny model: off vs on, batch 1, 1k and 32k, 64 tokens
#   resolution   bench/kdtree_bench/e2e/parity_resolution.py --servers sglang on the tiny model: an off baseline
#                and its A/A' floor (EAGLE's chain), an identical, an on and a chain candidate,
#                on-with-KDTREE_INJECT_FAULT candidates and perturbed-weight copies, through the
#                real gate (bench/kdtree_bench/models/parity_policy.yaml), eager forwards; RESOLUTION_SIZES /
#                RESOLUTION_FAULTS override the grid, RESOLUTION_TIMEOUT cuts it (table kept),
#                RESOLUTION_ARGS adds arguments (--no-controls: faults only)
#   long         bench/kdtree_bench/e2e/parity_long.py --servers sglang: the long corpus in the model's tokens
#                (LONG_BUCKETS, default 1024,8192,32768,128000 on LONG_PRESET rank), an off
#                baseline and its EAGLE-chain floor; an on candidate must pass, an on candidate
#                with KDTREE_INJECT_FAULT=LONG_FAULT (default kv_drop:20000) must fail through the
#                long buckets only (long.json/long.md); kimi-rank: LONG_PRESET=kimi-rank
#                LONG_BUCKETS=1024,32768,200000 LONG_POLICY=bench/kdtree_bench/models/parity_policy_kimi_rank.yaml;
#                LONG_ARGS adds arguments (e.g. --per-bucket 2 --new-tokens 24 for a shorter run)
# Phases run in the order given; `tests+correctness` runs both at once on the shared GPU (for
# phases that check correctness: timing phases run alone).
# SPEED_ARGS adds arguments to bench/kdtree_bench/e2e/sglang_e2e.py in the speed phase (e.g. --kv-dtype fp8;
# --profile-shape 1x1024: SGLang's profiler on that shape, the per-kernel table as profile.md;
# --host-samples: py-spy on the schedulers, from .sglsite/wheels, its table as host_samples.md);
# SPEED_PRESET is the make_model.py preset (default rank), SPEED_LAYERS its target layer count
# (default the preset's 4; records name such a model e.g. rank-61-layers); SPEED_SPEC=dflash or
# ddtree writes a DFlash draft (ddtree: add --budget N to SPEED_ARGS, default 16); a list
# (SPEED_SPEC=ddtree,dflash, or --budget 8,64) serves every mode once per algorithm and budget,
# all started together, so they compare on one card in one command (how many fit at 128k, and
# at which --mem-fraction: the second table of docs/development.md's memory plan);
# SPEED_DRAFT_ATTENTION (dflash, ddtree) sets the draft model's attention backend (SGLang's
# --speculative-draft-attention-backend, e.g. fa3 or flashinfer); records name it (draft_attention);
# SPEED_TIMEOUT (seconds, default 500) cuts the measurement and keeps what it measured so far
# (a shape cut midway keeps its repetitions done, marked cut).
# SGLANG_GPU_FLASHINFER=1 adds FlashInfer to the payload (.sglsite/flashinfer.tar.xz from
# bench/flashinfer_payload.sh), for SGLang arguments that name it.
# The deployment grid, one configuration family per command (add --kv-dtype fp8 for the fp8 KV;
# about 7-8 minutes each on an H200, servers' start included):
#   SPEED_ARGS="--shapes 1x1024,1x8192,1x32768,1x128000,8x1024,8x8192,8x32768,32x1024,32x8192 --graph-max-bs 32"
#   SPEED_PRESET=kimi-rank SPEED_ARGS="--shapes 1x1024,1x128000,1x200000 --graph-max-bs 1"
set -euo pipefail
: "${OUT:?set OUT to the output directory}"
cd "$(dirname "$0")/.."
site=/tmp/site
say() { printf '[sglang_gpu %s] %s\n' "$(date +%T)" "$*"; }

if [ -f .gpucache/caches.tgz ] && [ ! -d /tmp/triton-cache ]; then
  say "restoring carried compile caches"
  tar -C /tmp -xzf .gpucache/caches.tgz
fi
if [ ! -f "$site/sglang/launch_server.py" ]; then
  say "unpacking the SGLang payload"
  mkdir -p "$site" && tar xJf .sglsite/site.tar.xz -C "$site"
fi
# FlashInfer only when asked for (bench/flashinfer_payload.sh), e.g. for DFlash's draft attention
# with --server-arg=--speculative-draft-attention-backend=flashinfer; without it every server runs
# on the payload as it is.
if [ "${SGLANG_GPU_FLASHINFER:-0}" = 1 ]; then
  [ -f .sglsite/flashinfer.tar.xz ] ||
    { say "SGLANG_GPU_FLASHINFER=1 needs .sglsite/flashinfer.tar.xz: bench/flashinfer_payload.sh" >&2; exit 2; }
  if [ ! -d "$site/flashinfer" ]; then
    say "unpacking FlashInfer"
    tar xJf .sglsite/flashinfer.tar.xz -C "$site"
  fi
  export FLASHINFER_WORKSPACE_BASE=/tmp  # its JIT cache, kept while the machine stays warm
elif [ -d "$site/flashinfer" ]; then  # left by an earlier command on this warm machine
  rm -rf "$site/flashinfer" "$site"/flashinfer_python-*.dist-info
fi
say "installing kdtree-verify, kdtree-inference, kdtree-parity from this tree"
# The packages' own pure-Python dependencies that the payload lacks travel as .sglsite/wheels
# (docs/development.md); without them kdtree-parity and the backend's settings cannot import.
extra_wheels=(.sglsite/wheels/*.whl)
[ -e "${extra_wheels[0]}" ] || { say "no .sglsite/wheels: see docs/development.md" >&2; exit 2; }
python3 -m pip install -q --upgrade --no-deps --no-build-isolation --no-index --target "$site" \
  "${extra_wheels[@]}" ./lib/settings ./kernel ./services/inference ./services/parity 2>&1 | grep -v "already exists" || true
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
# DFlash's sampling verify needs FlashInfer's sampling kernels, which the payload never has
# (FlashInfer, when carried, serves attention only): bench/without_flashinfer marks it unavailable.
export PYTHONPATH=$PWD/bench/without_flashinfer:$PYTHONPATH
# kdtree_bench (the harness, the models) runs from this tree: python3 -m kdtree_bench....
export PYTHONPATH=$PYTHONPATH:$PWD/bench
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# The payload's Rust radix-tree core is built for torch 2.14 and panics on 2.11: use the Python one.
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
export TRITON_CACHE_DIR=/tmp/triton-cache KDTREE_BUILD_DIR=/tmp/kdtree-build KDTREE_CUDA_ARCHS=90
say "building the kernel from the installed package"
python3 -m kdtree_verify._build 2>&1 | tail -2
python3 -c 'import torch, sglang, kdtree_verify; print("sglang", sglang.__version__, "torch", torch.__version__, torch.cuda.get_device_name(), "kdtree_verify from", kdtree_verify.__file__)'
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/gpu.txt"

GPU_CLOCK_FIELDS=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu,temperature.gpu,clocks_throttle_reasons.active

run_phase() {
  local phase=$1
  say "phase $phase"
  case $phase in
    tests)
      # The checkout's tests, the installed packages: the tests' own imports of kdtree_verify and
      # kdtree_inference resolve to $site, not to the tree.
      # TESTS_ONLY: a file of test ids, one a line (e.g. what a run cut at its limit left).
      tests=(tests/gpu --ignore=tests/gpu/test_sglang_e2e.py)
      [ -z "${TESTS_ONLY:-}" ] || mapfile -t tests <"$TESTS_ONLY"
      timeout "${TESTS_TIMEOUT:-330}" python3 -m pytest -q -rs -p no:cacheprovider -o addopts="" \
        --durations=10 "${tests[@]}" >"$OUT/tests.log" 2>&1 || true
      tail -3 "$OUT/tests.log"
      timeout "${SELFCHECK_TIMEOUT:-200}" kdtree-selfcheck --out "$OUT/selfcheck" >"$OUT/selfcheck.log" 2>&1
      say "kdtree-selfcheck exit $?" ;;
    correctness)
      # One pytest per configuration family (E2E_CONFIGS, default eagle), all at once: each
      # family's servers start together behind start gates, and the families share the GPU. With
      # E2E_SEQUENTIAL=1 one family after another, each with the whole card.
      for config in ${E2E_CONFIGS:-eagle}; do
        KDTREE_E2E_CONFIG=$config KDTREE_E2E_OUT=$OUT/correctness/$config timeout "${E2E_TIMEOUT:-560}" \
          python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_sglang_e2e.py \
          >"$OUT/correctness_$config.log" 2>&1 &
        [ "${E2E_SEQUENTIAL:-0}" != 1 ] || wait
      done
      wait
      for config in ${E2E_CONFIGS:-eagle}; do
        tail -4 "$OUT/correctness_$config.log"
        cp "$OUT/correctness/$config/correctness.json" "$OUT/correctness_$config.json" || true
      done ;;
    speed)
      preset=${SPEED_PRESET:-rank}
      python3 -m kdtree_bench.models.make_model --preset "$preset" ${SPEED_LAYERS:+--layers "$SPEED_LAYERS"} \
        --device cuda "/tmp/models/$preset"
      spec_args=()
      case ,${SPEED_SPEC:-eagle}, in
        *,dflash,*|*,ddtree,*)
          python3 -m kdtree_bench.models.make_dflash_draft --target "/tmp/models/$preset" "/tmp/models/$preset-dflash"
          spec_args=(--spec "$SPEED_SPEC" --draft "/tmp/models/$preset-dflash") ;;
      esac
      # The draft model's attention backend (sglang_e2e.py refuses it without a draft model).
      [ -z "${SPEED_DRAFT_ATTENTION:-}" ] || spec_args+=(--draft-attention-backend "$SPEED_DRAFT_ATTENTION")
      # The GPU's clocks, power and throttle reasons every 200 ms, beside each repetition's
      # started_at in speed.json: a step that varies while its kernels do not shows up here.
      mkdir -p "$OUT/speed"
      nvidia-smi --format=csv,nounits -lms 200 --query-gpu="$GPU_CLOCK_FIELDS" \
        >"$OUT/speed/gpu_clocks.csv" 2>&1 &
      clocks=$!
      # SIGINT at SPEED_TIMEOUT: the servers stop, and speed.json keeps the shapes measured so
      # far (rewritten after each; the shape cut, its repetitions done), so the phase still
      # archives within the device's 10 minutes.
      # shellcheck disable=SC2086
      timeout -s INT -k 30 "${SPEED_TIMEOUT:-500}" python3 -m kdtree_bench.e2e.sglang_e2e \
        --model "/tmp/models/$preset" --out "$OUT/speed" "${spec_args[@]}" ${SPEED_ARGS:-} 2>&1 \
        | tee "$OUT/speed.log" || say "speed: bench/kdtree_bench/e2e/sglang_e2e.py exited $?"
      kill "$clocks" || true
      cp "$OUT/speed/speed.json" "$OUT/" || true
      # Each repetition's step time beside the clocks during it (here: nvidia-smi logs local time).
      python3 -m kdtree_bench.profiling.step_clocks "$OUT/speed/speed.json" "$OUT/speed/gpu_clocks.csv" \
        --out "$OUT/step_clocks.md" >/dev/null || true
      # With --profile-shape in SPEED_ARGS: the per-kernel table beside the archive.
      if [ -f "$OUT/speed/profile/profile.md" ]; then cp "$OUT/speed/profile/profile.md" "$OUT/"; fi
      if [ -f "$OUT/speed/host_samples/host_samples.md" ]; then
        cp "$OUT/speed/host_samples/host_samples.md" "$OUT/"
      fi ;;
    tree)
      # DDTree's tree step on this GPU: its tests (both searches, the graphs, no sync), then the
      # tree bench (graphs with torch's search or the Triton heap kernel, against eager).
      mkdir -p "$OUT/tree"
      timeout "${TREE_TIMEOUT:-150}" python3 -m pytest -q -rs -p no:cacheprovider -o addopts="" \
        tests/gpu/test_ddtree_tree_gpu.py >"$OUT/tree/tests.log" 2>&1 || true
      tail -3 "$OUT/tree/tests.log"
      # shellcheck disable=SC2086
      timeout "${TREE_BENCH_TIMEOUT:-200}" python3 -m kdtree_bench.profiling.ddtree_tree_bench \
        ${TREE_BENCH_ARGS:---budgets 8,16,32,64 --batches 1,8 --memory 32} \
        --out "$OUT/tree/ddtree_tree.json" 2>&1 | tee "$OUT/tree/bench.log" || true ;;
    kernel-bench)
      # shellcheck disable=SC2086
      timeout "${KERNEL_BENCH_TIMEOUT:-300}" python3 -m kdtree_bench.kernel.kernel_bench ${KERNEL_BENCH_ARGS:-} \
        --out "$OUT/kernel_bench.json" 2>&1 | tee "$OUT/kernel_bench.log" || true ;;
    kernel-fp8)
      timeout 330 python3 -m pytest -q -rs -p no:cacheprovider -k fp8 tests/gpu/test_kernel.py \
        tests/gpu/test_backend_fp8_gpu.py 2>&1 | tee "$OUT/kernel-fp8.log" || true ;;
    fp8-bench)
      timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 \
        python3 tests/gpu/kernel_sanitize_cases.py --fp8 2>&1 | tail -30 | tee "$OUT/sanitize_memcheck_fp8.log" || true
      timeout 200 python3 -m kdtree_bench.kernel.kernel_bench --kv-dtype fp8 --out "$OUT/h200_fp8.json" 2>&1 \
        | tee "$OUT/bench_fp8.log" || true ;;
    smoke)
      python3 -m kdtree_bench.models.make_model --preset tiny --device cuda /tmp/models/tiny
      python3 -m kdtree_bench.e2e.sglang_e2e --model /tmp/models/tiny --out "$OUT/smoke" --batches 1 \
        --prompt-lens 1024,32768 --new-tokens 64 --mem-fraction 0.1 --modes off,on 2>&1 | tee "$OUT/smoke.log" ;;
    resolution)
      python3 -m kdtree_bench.models.make_model --preset tiny --device cuda /tmp/models/tiny
      # SIGINT at the limit: the grid stops its servers, and its table so far stays written; a
      # grid still busy 30 s later (a server mid-start) is killed, so that the phase's archive
      # is still made within the device's 10 minutes (about 50 s of install and build before).
      # shellcheck disable=SC2086
      timeout -s INT -k 30 "${RESOLUTION_TIMEOUT:-480}" python3 -m kdtree_bench.e2e.parity_resolution \
        --servers sglang --model-dir /tmp/models/tiny --floor-chain \
        --policy bench/kdtree_bench/models/parity_policy.yaml ${RESOLUTION_ARGS:-} --out "$OUT/resolution" \
        --corpus-sizes "${RESOLUTION_SIZES:-40,100,200}" \
        --faults "${RESOLUTION_FAULTS:-scale:0.001,scale:0.01,scale:0.05,weight:1:0.004,weight:1:0.01,weight:1:0.05,kv_drop:64,kv_drop:16,kv_drop:0,tree_mask:7,tree_mask:3,tree_mask:0}" \
        2>&1 | tee "$OUT/resolution.log" || true
      cp "$OUT/resolution/resolution.json" "$OUT/resolution/resolution.md" "$OUT/" || true ;;
    long)
      preset=${LONG_PRESET:-rank}
      # SIGINT at the limit: the servers stop, long.json keeps the candidates judged so far.
      # shellcheck disable=SC2086
      timeout -s INT -k 30 "${LONG_TIMEOUT:-480}" python3 -m kdtree_bench.e2e.parity_long --servers sglang \
        --preset "$preset" --model-dir "/tmp/models/$preset" \
        --buckets "${LONG_BUCKETS:-1024,8192,32768,128000}" --fault "${LONG_FAULT:-kv_drop:20000}" \
        --policy "${LONG_POLICY:-bench/kdtree_bench/models/parity_policy.yaml}" ${LONG_ARGS:-} --out "$OUT/long" 2>&1 \
        | tee "$OUT/long.log" || true
      cp "$OUT/long/long.json" "$OUT/long/long.md" "$OUT/" || true ;;
    *) echo "unknown phase $phase" >&2; exit 2 ;;
  esac
  # At most 8 files come back from a device command: each phase's folder travels as one archive.
  if [ -d "$OUT/$phase" ]; then
    tar -C "$OUT" -cJf "$OUT/$phase.tar.xz" "$phase" && rm -rf "${OUT:?}/$phase"
  fi
}

for group in "$@"; do
  IFS=+ read -ra phases <<<"$group"
  if [ "${#phases[@]}" -eq 1 ]; then
    run_phase "${phases[0]}"
    continue
  fi
  # Phases joined by '+' share the GPU at once (after one install and build): correctness phases
  # only, since each slows the others down.
  pids=()
  for phase in "${phases[@]}"; do run_phase "$phase" & pids+=($!); done
  for pid in "${pids[@]}"; do wait "$pid" || say "a phase of $group exited $?"; done
done
# The compile caches, for a later command to carry (KDTREE_GPU_CACHES): Triton's, the kernel's.
say "caches: $(du -sh /tmp/triton-cache /tmp/kdtree-build 2>/dev/null | tr '\n' ' ')"
tar -C /tmp -czf "$OUT/caches.tgz" triton-cache kdtree-build 2>/dev/null || true
ls -la "$OUT/caches.tgz" || true
