# device command of e2e 8 (nvidia-h200, carry .sglsite and .gpucache), at 1343749: off, on and on_draft_triton at
# batch 1, 1k and 8k, 1024 new tokens per request (four times e2e 3's, for steadier step times)
mkdir -p $OUT && SPEED_ARGS="--modes off,on,on_draft_triton --batches 1 --prompt-lens 1024,8192 --new-tokens 1024 --graph-max-bs 1 --mem-fraction 0.15" timeout 480 bash bench/sglang_gpu.sh speed
