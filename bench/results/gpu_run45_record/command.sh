#!/usr/bin/env bash
# Device command of run 45: the benchmark of record for d3e3bec (every contender), the grid shapes
# that run 44's record part did not reach (run 44's part travels in ab_probe/record_a.json).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$PWD/.triton-cache
ls .triton-cache 2>/dev/null | wc -l
wv() { local n=$1; shift; PYTHONPATH=$PWD/ab/$n/kernel:$PWD/services/inference:$PYTHONPATH KDTREE_BUILD_DIR=/tmp/ab-build/$n "$@"; }
SH=$(python3 - <<'PY'
import json
done = {(r["B"], r["H"], r["T"], r["prefix"]) for r in json.load(open("ab_probe/record_a.json"))["records"]}
grid = [(B, H, T, P) for B in (1, 8, 32) for H in (8, 16, 128) for T in (8, 16, 32) for P in (4096, 32768, 131072)]
print(",".join("x".join(map(str, s)) for s in grid if s not in done))
PY
)
echo "shapes: $SH"
wv wave timeout 570 python3 bench/kernel_bench.py --shapes $SH --out $OUT/record_b.json > $OUT/record_b.log 2>&1
echo "record rc $? at ${SECONDS}s"
