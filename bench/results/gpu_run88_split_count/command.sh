# at 21ab2d9, on the GPU machine after bench/sglang_gpu.sh had set up /tmp/site in the same command (carry: .sglsite)
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH TRITON_CACHE_DIR=/tmp/triton-cache KDTREE_BUILD_DIR=/tmp/kdtree-build KDTREE_CUDA_ARCHS=90 SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
for n in 64 132 264; do
  python3 bench/kernel_bench.py --kv-dtype fp8 --shapes 8x16x16x1024,8x16x16x4096 --target-ctas $n --out $OUT/fp8_ctas$n.json > $OUT/fp8_ctas$n.log 2>&1
done
