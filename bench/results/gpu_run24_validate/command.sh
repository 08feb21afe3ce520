# Device command: the GPU tests of main (they now run Engine.generate_greedy through
# tests/gpu/test_engine_gpu.py) and the engine parity corpus through the same helper.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run24; mkdir -p $R; trap 'tar -czf $OUT/run24.tgz -C /tmp run24' EXIT
OUT=$R bash bench/gpu_session.sh test; rc=$?
export PYTHONPATH=$PYTHONPATH:$PWD/kernel:$PWD/services/inference
timeout 240 python3 -m kdtree_inference.engine.gpu_parity --prompts 100 --out $R/engine_gpu_parity.json > $R/engine_gpu_parity.log 2>&1; rc=$((rc | $?))
tail -3 $R/engine_gpu_parity.log
exit $rc
