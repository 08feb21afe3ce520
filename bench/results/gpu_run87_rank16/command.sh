# at b174ad8 (the kernel and bench unchanged since)
# on the GPU machine, after bench/sglang_gpu.sh had set up /tmp/site in the same command (carry: .sglsite)
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH TRITON_CACHE_DIR=/tmp/triton-cache KDTREE_BUILD_DIR=/tmp/kdtree-build KDTREE_CUDA_ARCHS=90 SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
S=8x16x16x1024,1x16x16x1024,8x16x16x4096,1x16x16x131072
python3 bench/kernel_bench.py --kv-dtype fp8 --shapes $S --out $OUT/fp8.json > $OUT/fp8.log 2>&1
python3 bench/kernel_bench.py --shapes $S --out $OUT/bf16.json > $OUT/bf16.log 2>&1
