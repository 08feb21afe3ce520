#!/usr/bin/env bash
# Device command of run 81: every GPU test at the shipped kernel except the 8-server SGLang
# end-to-end file (tests/gpu/test_sglang_e2e.py, run through bench/sglang_gpu.sh correctness), with
# the SGLang payload on the path so the backend's bf16 and fp8 tests import SGLang's real code;
# then the three sanitizers over the bf16 cases and memcheck over the fp8 cases.
set -uo pipefail
site=/tmp/site
[ -f $site/sglang/launch_server.py ] || { mkdir -p $site && tar xJf .sglsite/site.tar.xz -C $site; }
[ -d /tmp/triton-cache ] || tar -C /tmp -xzf .gpucache/caches.tgz
export PYTHONPATH=$site:$PWD/kernel:$PWD/services/inference PYTHONUNBUFFERED=1
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python TRITON_CACHE_DIR=/tmp/triton-cache
export KDTREE_BUILD_DIR=/tmp/kdtree-build KDTREE_CUDA_ARCHS=90
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv > $OUT/gpu.txt
python3 -m kdtree_verify._build 2>&1 | tail -2 > $OUT/build.log
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu -o addopts="" -rs --durations=10 \
  --ignore=tests/gpu/test_sglang_e2e.py > $OUT/test.log 2>&1
echo "tests rc $? at ${SECONDS}s"
for tool in memcheck synccheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py \
    2>&1 | tail -30 > $OUT/sanitize_$tool.log
  echo "$tool rc ${PIPESTATUS[0]} at ${SECONDS}s"
done
timeout 80 compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/gpu/kernel_sanitize_cases.py --fp8 \
  2>&1 | tail -30 > $OUT/sanitize_memcheck_fp8.log
echo "memcheck fp8 rc ${PIPESTATUS[0]} at ${SECONDS}s"
tail -1 $OUT/test.log; grep -h SKIPPED $OUT/test.log; grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" $OUT/sanitize_*.log
