# Device command: tests, memcheck, serving figures and the TORCH_CHECK probe of the current tree.
set -uo pipefail
R=/tmp/run13; mkdir -p $R
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
OUT=$R bash bench/gpu_session.sh test; rc=$?
OUT=$R bash bench/gpu_session.sh sanitize; rc=$((rc | $?))
export PYTHONPATH=$PYTHONPATH:$PWD/kernel:$PWD/services/inference
python3 bench/layer_bench.py --out $R/layer_h200.json > $R/layer_bench.log 2>&1; rc=$((rc | $?))
python3 -m kdtree_inference.engine.gpu_parity --prompts 100 --out $R/engine_gpu_parity.json > $R/engine_gpu_parity.log 2>&1; rc=$((rc | $?))
python3 - > $R/torch_check_probe.log 2>&1 <<'PY'
import torch
from kdtree_verify._build import load
ext = load()
i32 = dict(dtype=torch.int32, device="cuda")
try:
    ext.plan(torch.zeros(3, **i32), torch.zeros(2, **i32), None,
             torch.empty(1024, dtype=torch.uint8, device="cuda"), [0] * 6, 2, 8, 1, 1, 132)
    print("no error raised (unexpected)")
except RuntimeError as exc:
    print("clean RuntimeError from a failing TORCH_CHECK:", str(exc).splitlines()[0])
PY
echo "probe exit: $?" >> $R/torch_check_probe.log
cat $R/torch_check_probe.log; tail -n 3 $R/test.log $R/sanitize.log $R/layer_bench.log $R/engine_gpu_parity.log
tar -czf $OUT/run13.tgz -C /tmp run13
exit $rc
