# device command of run 3 (nvidia-h200, carry .sglsite), at 82247d6
mkdir -p $OUT && bash bench/sglang_gpu.sh correctness speed
