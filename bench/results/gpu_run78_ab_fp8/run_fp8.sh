#!/usr/bin/env bash
# fp8 A/B on the GPU machine: ab/{main,int,f16}; the fp8 tests and memcheck for int and f16, then
# the fp8 benchmark (fp8 pool vs bf16 pool vs Triton's fp8 path) for all three, two passes.
set -uo pipefail
site=/tmp/site
[ -f $site/sglang/launch_server.py ] || { mkdir -p $site && tar xJf .sglsite/site.tar.xz -C $site; }
[ -d /tmp/triton-cache ] || tar -C /tmp -xzf .gpucache/caches.tgz
export PYTHONUNBUFFERED=1 SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TRITON_CACHE_DIR=/tmp/triton-cache KDTREE_CUDA_ARCHS=90 PYTHONPATH=$site
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv | tee $R/gpu.txt
git log --oneline -1 > $R/commit.txt
for v in main int f16; do bash bench/ab_kernels.sh with $v python3 -m kdtree_verify._build >$R/$v.build.log 2>&1 & done; wait
tail -n 2 $R/*.build.log
for v in int f16; do
  echo "== tests $v $(date +%T)"
  timeout 150 bash bench/ab_kernels.sh with $v python3 -m pytest -q -p no:cacheprovider -o addopts="" -rs \
    -k fp8 ab/$v/tests/gpu/test_kernel.py tests/gpu/test_backend_fp8_gpu.py >$R/$v.test.log 2>&1
  tail -n 3 $R/$v.test.log
  timeout 70 bash bench/ab_kernels.sh with $v compute-sanitizer --tool memcheck --error-exitcode 1 \
    python3 ab/$v/tests/gpu/kernel_sanitize_cases.py --fp8 >$R/$v.memcheck.log 2>&1
  echo "memcheck rc $?"; tail -n 1 $R/$v.memcheck.log
done
for pass in 1 2; do for v in main int f16; do
  echo "== bench $v pass $pass $(date +%T)"
  timeout 60 bash bench/ab_kernels.sh with $v python3 bench/kernel_bench.py --kv-dtype fp8 --out $R/$v.p$pass.json \
    >$R/$v.p$pass.bench.log 2>&1
  grep -E "^B=|min_speedup_fp8" $R/$v.p$pass.bench.log | sed -E 's/ +ideal.*bf16/ bf16/; s/ +triton_fp8.*//'
done; done
tar -C $OUT -czf $OUT/ab_fp8.tgz r && cp $R/*.p1.json $OUT/ 2>/dev/null; ls -la $OUT
