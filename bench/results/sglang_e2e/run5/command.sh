# device command of run 5 (nvidia-h200, carry .sglsite and .gpucache: run 4's compile caches), at a7bc453
mkdir -p $OUT && bash bench/sglang_gpu.sh correctness
