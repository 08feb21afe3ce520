# device command of run 78 (nvidia-h200, carry .sglsite, .gpucache and ab): ab/main = main at
# de50964, ab/int = exp/fp8-int at 3e4ffb4, ab/f16 = exp/fp8-f16mma at 714e523 (prepared with
# bench/ab_kernels.sh prepare; the driver is run_fp8.sh next to this file)
mkdir -p $OUT && bash ab/run_fp8.sh
