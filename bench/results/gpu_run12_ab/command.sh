# Device command of this run (variants under ab/: main, experiment_s-chains, experiment_l2-prefetch, experiment_s-chains_l2-prefetch, and main and the last with kChunkMinTokens = 4 * kBlockN as *_chunk128)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/.stubs && export KDTREE_CUDA_ARCHS=90 && AB_TESTS="late_score or ragged or graph" OUT=$OUT bash bench/ab_kernels.sh run
# (before ab_kernels.sh packed its outputs: only 8 files came back; rc 0, so every variant passed AB_TESTS)
