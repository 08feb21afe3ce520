# the working tree at 9231127 with profile_kernel's fp8 flags (committed as 9f18bf7), on one H100 (nvidia-h100-x1), cold start, wall 100.9 s
# bench/sglang_gpu.sh with no phase: the payload, the packages and the kernel built (KDTREE_CUDA_ARCHS=90)
timeout 110 bash bench/sglang_gpu.sh
export PYTHONPATH=/tmp/site:$PWD/bench KDTREE_BUILD_DIR=/tmp/kdtree-build KDTREE_CUDA_ARCHS=90 PATH=/tmp/site/bin:$PATH
for m in fp16 triton; do
  timeout 45 ncu --clock-control none --kernel-name regex:"plan_kernel|attention_kernel|combine_kernel" \
    --launch-skip 0 --launch-count 16 --section SpeedOfLight \
    python3 -m kdtree_bench.profiling.profile_kernel --batch 8 --heads 8 --draft 8 --prefix 32768 \
      --kv-dtype fp8 --fp8-numerics $m > $OUT/ncu_fp8_$m.log 2>&1
done
