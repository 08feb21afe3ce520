# The working tree at 61a5776 (kernel as bc6434e) with ab/8776b0a and ab/bc6434e carried
# (bench/ab_kernels.sh prepare 8776b0a bc6434e), on one H100 (NVIDIA H100 80GB HBM3), warm after
# e2e 58. Three device commands, since the machine returns at most 8 files per command:
# 1) this script (wall 263.5 s): the bench_*.json/.log files come from it; its bits, ncu and GPU
#    test logs did not come back;
# 2) a 10 s command that found none of them on the machine;
# 3) (wall 115.4 s) bits_against.log, ncu_bc6434e_*.log and kernel-fp8.log again, on the same warm
#    machine against the same /tmp/base.pt (8776b0a's outputs saved by 1)).
set -u
END=$(( $(date +%s) + ${BUDGET_S:-565} ))
cap() { local left=$(( END - $(date +%s) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
say() { printf '[fp8_ab %s] %s\n' "$(date +%T)" "$*" | tee -a $OUT/steps.log; }
timeout $(cap 150) bash bench/sglang_gpu.sh > $OUT/setup.log 2>&1; say "setup rc=$?"
export PYTHONPATH=/tmp/site:$PWD/bench KDTREE_CUDA_ARCHS=90 PATH=/tmp/site/bin:$PATH
t=$(cap 200)
for v in 8776b0a bc6434e; do
  (timeout $t bench/ab_kernels.sh with $v python3 -m kdtree_verify._build > $OUT/build_$v.log 2>&1; echo "build $v rc=$?" >> $OUT/build_$v.log) &
done
wait; say "$(tail -qn1 $OUT/build_*.log | tr '\n' ' ')"
timeout $(cap 60) bench/ab_kernels.sh with 8776b0a python3 -m kdtree_bench.kernel.output_bits --save /tmp/base.pt > $OUT/bits_base.log 2>&1; say "bits save rc=$?"
timeout $(cap 60) bench/ab_kernels.sh with bc6434e python3 -m kdtree_bench.kernel.output_bits --against /tmp/base.pt > $OUT/bits_against.log 2>&1; say "bits against rc=$?"
for pass in 1 2; do for v in 8776b0a bc6434e; do
  timeout $(cap 45) bench/ab_kernels.sh with $v python3 -m kdtree_bench.kernel.kernel_bench --kv-dtype fp8 --kdtree-only --shapes 8x8x8x32768 --out $OUT/bench_${v}_$pass.json > $OUT/bench_${v}_$pass.log 2>&1; say "bench $v pass $pass rc=$?"
done; done
for m in fp16 triton; do
  timeout $(cap 45) bench/ab_kernels.sh with bc6434e ncu --clock-control none --kernel-name regex:"plan_kernel|attention_kernel|combine_kernel" \
    --launch-skip 0 --launch-count 16 --section SpeedOfLight \
    python3 -m kdtree_bench.profiling.profile_kernel --batch 8 --heads 8 --draft 8 --prefix 32768 \
      --kv-dtype fp8 --fp8-numerics $m > $OUT/ncu_bc6434e_$m.log 2>&1; say "ncu bc6434e $m rc=$?"
done
timeout $(cap 300) bash bench/sglang_gpu.sh kernel-fp8 > $OUT/kernel_fp8.log 2>&1; say "kernel-fp8 rc=$?"
# 3) kernel-fp8.log: python3 -m pytest -q -rs -p no:cacheprovider -k fp8 tests/gpu/test_kernel.py tests/gpu/test_backend_fp8_gpu.py
