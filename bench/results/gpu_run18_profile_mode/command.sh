# Device command of this run: the profile mode of bench/gpu_session.sh as committed (main, unchanged kernel)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90; OUT=$OUT bash bench/gpu_session.sh profile
