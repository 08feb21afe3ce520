#!/usr/bin/env bash
# Device command of run 76: fewer, longer splits at the small shapes (bench/README, "What to try
# next", item 4, "untried"). Our kernel alone at the 9 grid shapes with ideal < 12 us, planned for
# one wave (the default, 132 CTAs on the H200) and for 99, 66 and 33 CTAs; two interleaved passes.
set -uo pipefail
export PYTHONPATH=$PWD/kernel KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
python3 -m kdtree_verify._build > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
shapes=1x8x8x4096,1x8x16x4096,1x8x32x4096,1x16x8x4096,1x16x16x4096,1x16x32x4096,8x8x8x4096,8x8x16x4096,1x8x8x32768
mkdir -p $OUT/runs
for pass in 1 2; do
  for n in default 99 66 33; do
    flag=; [[ $n != default ]] && flag="--target-ctas $n"
    python3 bench/kernel_bench.py --kdtree-only --shapes $shapes $flag \
      --out $OUT/runs/ctas_${n}_pass$pass.json > $OUT/runs/ctas_${n}_pass$pass.log 2>&1
    echo "pass $pass ctas $n rc $? at ${SECONDS}s"
  done
done
python3 - "$OUT/runs" <<'PY' | tee $OUT/compare.txt
import json, sys
from pathlib import Path
runs = Path(sys.argv[1])
names = ["default", "99", "66", "33"]
res = {(n, p): json.loads((runs / f"ctas_{n}_pass{p}.json").read_text())["records"] for n in names for p in (1, 2)}
print("shape (BxHxTxP)   " + "  ".join(f"{n:>24}" for n in names))
print(" " * 18 + "  ".join(f"{'us p1/p2 (split, ctas)':>24}" for _ in names))
for i, r in enumerate(res[("default", 1)]):
    cells = []
    for n in names:
        a, b = res[(n, 1)][i], res[(n, 2)][i]
        cells.append(f"{a['kdtree_us']:6.2f}/{b['kdtree_us']:6.2f} ({a['split_tokens']:4d},{a['target_ctas']:3d})")
    print(f"{r['B']}x{r['H']}x{r['T']}x{r['prefix']:<8} " + "  ".join(f"{c:>24}" for c in cells))
PY
tar -czf $OUT/runs.tgz -C $OUT runs && rm -rf $OUT/runs
