# Device command of this run (variants under ab/: main, load_after_s, load_in_pv, load_after_s_select; patches in variants/)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90; AB_TESTS="late_score or ragged or graph or input_variants" OUT=$OUT bash bench/ab_kernels.sh run
