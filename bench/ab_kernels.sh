#!/usr/bin/env bash
# A/B kernel variants in one GPU lease.
#   bench/ab_kernels.sh prepare REF [REF...]   (dev machine) ab/<name>/kernel and
#                                              ab/<name>/tests/gpu = those directories at git REF
#                                              (a variant dir may then be edited by hand)
#   bench/ab_kernels.sh run                    (GPU machine, carry "ab") builds every ab/* variant
#                                              in parallel, runs AB_TESTS (a pytest -k expression
#                                              over the variant's own tests/gpu/test_kernel.py;
#                                              default: none) for the variants named in
#                                              AB_TEST_VARIANTS (default: all), then times our
#                                              kernel alone over the grid for each, AB_REPEATS
#                                              times (default 1; the variants take turns in each
#                                              pass), and prints bench/kdtree_bench/analysis/compare_runs.py's table per
#                                              pass (base: ab/main where present, else the first;
#                                              with 2+ passes also the base's pass 2 against its
#                                              pass 1, the noise). AB_BENCH_ARGS go to
#                                              kernel_bench.py (e.g. "--shapes 1x8x8x32768").
#   bench/ab_kernels.sh with NAME CMD [ARG...] runs CMD against variant NAME: its kdtree_verify
#                                              first on PYTHONPATH and its own build dir
#                                              (/tmp/ab-build/NAME), for what run does not do
#                                              (a test subset, ncu, compute-sanitizer; build it
#                                              with "python3 -m kdtree_verify._build").
# Raw logs and the kdtree-only JSONs are packed into $OUT/ab_results.tar.gz (the GPU machine
# returns at most 8 files), next to the compare*.txt tables; $OUT defaults to bench/results/ab.
set -uo pipefail
# kdtree_bench (kernel_bench, compare_runs) runs from this tree: python3 -m kdtree_bench....
export PYTHONPATH=$PWD/bench${PYTHONPATH:+:$PYTHONPATH}
with_variant() {  # with_variant NAME CMD...: run CMD against variant NAME's package and build dir
  local name=$1
  shift
  PYTHONPATH="$PWD/ab/$name/kernel:$PWD/services/inference${PYTHONPATH:+:$PYTHONPATH}" \
    KDTREE_BUILD_DIR="/tmp/ab-build/$name" "$@"
}
cmd=${1:-}
shift || true
case $cmd in
  prepare)
    [[ $# -ge 1 ]] || { echo "usage: $0 prepare REF [REF...]" >&2; exit 2; }
    for ref in "$@"; do
      name=${ref//[^A-Za-z0-9._-]/_}
      rm -rf "ab/$name" && mkdir -p "ab/$name"
      git archive "$ref" kernel tests/gpu | tar -x -C "ab/$name" || exit 1
      echo "ab/$name <- $ref ($(git rev-parse --short "$ref"))"
    done
    ;;
  with)
    [[ $# -ge 2 ]] || { echo "usage: $0 with NAME CMD [ARG...]" >&2; exit 2; }
    [[ -d ab/$1/kernel ]] || { echo "no variant ab/$1 (run prepare first)" >&2; exit 2; }
    with_variant "$@"
    ;;
  run)
    final_out=${OUT:-bench/results/ab}
    OUT=$(mktemp -d)/ab_results
    mkdir -p "$OUT" "$final_out"
    trap 'tar -czf "$final_out/ab_results.tar.gz" -C "$(dirname "$OUT")" ab_results; cp "$OUT"/compare*.txt "$final_out/" 2>/dev/null' EXIT
    variants=()
    shopt -s nullglob
    [[ -d ab/main ]] && variants+=(main)  # the base of the comparison, where present
    for d in ab/*/; do [[ $(basename "$d") != main ]] && variants+=("$(basename "$d")"); done
    [[ ${#variants[@]} -ge 1 ]] || { echo "no variants under ab/ (run prepare first)" >&2; exit 2; }
    passes=${AB_REPEATS:-1}
    [[ $passes =~ ^[1-9][0-9]*$ ]] || { echo "AB_REPEATS must be a positive integer" >&2; exit 2; }
    test_variants=" ${AB_TEST_VARIANTS:-${variants[*]}} "
    for name in ${AB_TEST_VARIANTS:-}; do
      [[ -d ab/$name/kernel ]] || { echo "AB_TEST_VARIANTS: no variant ab/$name" >&2; exit 2; }
    done
    export PYTHONUNBUFFERED=1
    export KDTREE_CUDA_ARCHS=${KDTREE_CUDA_ARCHS:-$(python3 -c 'import torch; p = torch.cuda.get_device_capability(); print(f"{p[0]}{p[1]}")')}
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv | tee "$OUT/gpu.txt"
    declare -A build_pid
    for name in "${variants[@]}"; do
      with_variant "$name" python3 -m kdtree_verify._build >"$OUT/$name.build.log" 2>&1 &
      build_pid[$name]=$!
    done
    rc=0
    built=()
    for name in "${variants[@]}"; do
      echo "== $name"
      if ! wait "${build_pid[$name]}"; then
        echo "build failed:"
        tail -20 "$OUT/$name.build.log"
        rc=1
        continue
      fi
      tail -1 "$OUT/$name.build.log"
      built+=("$name")
      if [[ -n ${AB_TESTS:-} && $test_variants == *" $name "* ]]; then
        tests=ab/$name/tests/gpu/test_kernel.py  # the variant's own tests, where prepare put them
        [[ -f $tests ]] || tests=tests/gpu/test_kernel.py
        with_variant "$name" python3 -m pytest -q -p no:cacheprovider "$tests" \
          -o addopts="" -k "$AB_TESTS" >"$OUT/$name.test.log" 2>&1
        rc=$((rc | $?))
        echo "$tests: $(tail -1 "$OUT/$name.test.log")"
      fi
    done
    for ((pass = 1; pass <= passes; pass++)); do
      suffix=$([[ $passes -gt 1 ]] && echo ".$pass")
      results=()
      for name in "${built[@]}"; do
        # shellcheck disable=SC2086  # AB_BENCH_ARGS is a list of arguments
        with_variant "$name" python3 -m kdtree_bench.kernel.kernel_bench --kdtree-only ${AB_BENCH_ARGS:-} \
          --out "$OUT/$name$suffix.json" >"$OUT/$name$suffix.bench.log" 2>&1
        rc=$((rc | $?))
        echo "$name$suffix: $(tail -1 "$OUT/$name$suffix.bench.log")"
        [[ -f $OUT/$name$suffix.json ]] && results+=("$OUT/$name$suffix.json")
      done
      if [[ ${#results[@]} -ge 1 ]]; then
        python3 -m kdtree_bench.analysis.compare_runs "${results[@]}" | tee "$OUT/compare$suffix.txt"
      fi
    done
    base=${built[0]:-}
    if [[ $passes -gt 1 && -f $OUT/$base.1.json && -f $OUT/$base.2.json ]]; then
      python3 -m kdtree_bench.analysis.compare_runs "$OUT/$base.1.json" "$OUT/$base.2.json" |
        tee "$OUT/compare.noise.txt"
    fi
    exit $rc
    ;;
  *)
    echo "usage: $0 prepare REF [REF...] | run | with NAME CMD [ARG...]" >&2
    exit 2
    ;;
esac
