#!/usr/bin/env bash
# Device command of run 64: the benchmark of record for the shipped code, the grid shapes that
# run 63 did not reach (run 63's part travels in rec/record_a.json), on the machine run 63 left
# warm (its Triton cache in the tree).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs:$PWD/kernel:$PWD/services/inference KDTREE_CUDA_ARCHS=90
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.triton-cache
echo "triton cache files: $(find .triton-cache -type f 2>/dev/null | wc -l)"
python3 -m kdtree_verify._build > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
SH=$(python3 - <<'PY'
import json
done = {(r["B"], r["H"], r["T"], r["prefix"]) for r in json.load(open("rec/record_a.json"))["records"]}
grid = [(B, H, T, P) for B in (1, 8, 32) for H in (8, 16, 128) for T in (8, 16, 32) for P in (4096, 32768, 131072)]
print(",".join("x".join(map(str, s)) for s in grid if s not in done))
PY
)
echo "shapes: $SH"
timeout $((480 - SECONDS)) python3 bench/kernel_bench.py --shapes $SH --out $OUT/record_b.json > $OUT/record_b.log 2>&1
echo "record rc $? at ${SECONDS}s"
tail -n 3 $OUT/record_b.log
