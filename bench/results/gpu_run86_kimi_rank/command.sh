# at 220bc84, on the GPU machine after bench/sglang_gpu.sh had set up /tmp/site (carry: .sglsite .gpucache)
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH TRITON_CACHE_DIR=/tmp/triton-cache KDTREE_BUILD_DIR=/tmp/kdtree-build KDTREE_CUDA_ARCHS=90 SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
S=1x8x16x131072,1x8x16x204800,1x8x8x131072,8x8x16x32768
python3 bench/kernel_bench.py --shapes $S --out $OUT/kimi_bf16.json > $OUT/kimi_bf16.log 2>&1
python3 bench/kernel_bench.py --kv-dtype fp8 --shapes $S --out $OUT/kimi_fp8.json > $OUT/kimi_fp8.log 2>&1
