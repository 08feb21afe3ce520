#!/usr/bin/env bash
# Device command of run 49, main (kernel d3e3bec): all GPU tests; the backend's layer benchmark and
# the engine's 100-prompt GPU parity (refreshing layer_h200.json and engine_gpu_parity.json, last
# measured on kernel a946227 in run 41); and our kernel alone at the 8 shapes with ideal < 10 µs
# plus two larger ones, once per L2 state (kernel_bench.py --l2 flushed, clean, warm).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/.stubs:$PWD/kernel:$PWD/services/inference KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run49; mkdir -p $R; pack() { tar -czf $OUT/run49.tgz -C /tmp run49; }; trap pack EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
python3 -m kdtree_verify._build 2>&1 | tail -1 | tee $R/build.log; echo "built at ${SECONDS}s"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu -o addopts="" > $R/test.log 2>&1
echo "tests/gpu rc $?: $(tail -1 $R/test.log) at ${SECONDS}s"; pack
timeout 100 python3 bench/layer_bench.py --out $R/layer_h200.json > $R/layer_bench.log 2>&1
echo "layer_bench rc $? at ${SECONDS}s"; tail -4 $R/layer_bench.log
timeout 120 python3 -m kdtree_inference.engine.gpu_parity --prompts 100 --out $R/engine_gpu_parity.json > $R/engine_gpu_parity.log 2>&1
echo "gpu_parity rc $? at ${SECONDS}s"; tail -2 $R/engine_gpu_parity.log; pack
S=1x8x8x4096,1x8x8x32768,1x8x16x4096,1x8x32x4096,1x16x8x4096,1x16x16x4096,1x16x32x4096,8x8x8x4096,1x128x16x32768,8x16x16x32768
for l2 in flushed clean warm; do
  timeout 60 python3 bench/kernel_bench.py --kdtree-only --shapes $S --l2 $l2 --out $R/l2_$l2.json > $R/l2_$l2.log 2>&1
  echo "l2 $l2 rc $? at ${SECONDS}s"
done
python3 - <<'PY' | tee $R/l2_states.txt
import json
runs = {m: {(r["B"], r["H"], r["T"], r["prefix"]): r for r in json.load(open(f"/tmp/run49/l2_{m}.json"))["records"]} for m in ("flushed", "clean", "warm")}
print("layer call / plan (µs) per L2 state")
for k in runs["flushed"]:
    print(" ".join(map(str, k)).ljust(16), "  ".join(f"{m} {runs[m][k]['kdtree_layer_us']:8.2f} / {runs[m][k]['kdtree_plan_us']:5.2f}" for m in runs))
PY
cp $R/layer_h200.json $R/engine_gpu_parity.json $OUT/ 2>/dev/null
