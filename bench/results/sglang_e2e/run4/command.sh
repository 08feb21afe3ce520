# device command of run 4 (nvidia-h200, carry .sglsite and .gpucache: run 3's compile caches), at 6a0d538
mkdir -p $OUT && bash bench/sglang_gpu.sh correctness kernel-fp8
