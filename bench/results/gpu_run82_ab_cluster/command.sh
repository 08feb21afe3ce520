#!/usr/bin/env bash
# 2-CTA cluster A/B: main vs exp_cluster-kv (each CTA of a pair loads half of every KV tile and
# forwards it to the peer through DSMEM). The variant's bf16/fp16 kernel tests (SGLang's Triton
# kernels on the path as the oracle), two interleaved kdtree-only passes over run 58's 18 shapes,
# then memcheck over the variant's sanitizer cases.
set -uo pipefail
site=/tmp/site
[ -f $site/sglang/launch_server.py ] || { mkdir -p $site && tar xJf .sglsite/site.tar.xz -C $site; }
export PYTHONPATH=$site SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
SHAPES=1x8x8x4096,1x8x8x32768,1x8x8x131072,1x8x16x32768,1x8x16x131072,1x16x16x32768
SHAPES+=,1x128x8x32768,1x128x16x32768,1x128x16x131072,1x128x32x32768,8x8x8x32768,8x16x16x32768
SHAPES+=,8x128x16x32768,32x8x8x131072,32x8x16x32768,32x16x16x32768,32x128x16x32768,32x128x32x32768
AB_TESTS="not fp8" AB_TEST_VARIANTS="exp_cluster-kv" AB_BENCH_ARGS="--shapes $SHAPES" AB_REPEATS=2 \
  OUT=$OUT timeout 420 bash bench/ab_kernels.sh run
echo "ab_kernels rc $? at ${SECONDS}s"
tar xzf $OUT/ab_results.tar.gz -O --wildcards '*exp_cluster-kv.test.log' | grep -E "FAILED|passed|failed|Error|error" | head -30
timeout 90 bash bench/ab_kernels.sh with exp_cluster-kv compute-sanitizer --tool memcheck --error-exitcode 1 \
  python3 ab/exp_cluster-kv/tests/gpu/kernel_sanitize_cases.py > $OUT/memcheck_cluster.log 2>&1
echo "memcheck rc $? at ${SECONDS}s"; tail -3 $OUT/memcheck_cluster.log
ls -la $OUT
