# device command of run 7 (nvidia-h200, carry .sglsite and .gpucache), at 89c7a56 with the rank model's max_position_embeddings raised to 131072
mkdir -p $OUT && SPEED_ARGS="--modes off,on --batches 1 --prompt-lens 1024,65536 --graph-max-bs 1 --mem-fraction 0.2" timeout 400 bash bench/sglang_gpu.sh speed
