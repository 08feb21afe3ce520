# device command of run 6 (nvidia-h200, carry .sglsite and .gpucache), at fd5f92c (kernel as 89c7a56: the bf16 path's SASS is unchanged by the fp8 merge)
mkdir -p $OUT && SPEED_ARGS="--modes off,on --batches 1,8 --prompt-lens 1024,32768,65536 --graph-max-bs 8 --mem-fraction 0.2" timeout 590 bash bench/sglang_gpu.sh speed
