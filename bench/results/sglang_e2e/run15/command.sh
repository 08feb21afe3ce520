# On the GPU machine (carry: .sglsite), at d0fed75 with `tests+correctness` in bench/sglang_gpu.sh
# (phases joined by '+' share the GPU after one install and build).
# e2e 15: every GPU test and kdtree-selfcheck next to the kimi family, whose A/A' floor was then
# off with --chunked-prefill-size 16 (the tests phase was cut at 280 s, 208 tests in, 0 failed):
E2E_CONFIGS=kimi E2E_TIMEOUT=450 TESTS_TIMEOUT=280 SELFCHECK_TIMEOUT=150 timeout 580 \
  bash bench/sglang_gpu.sh tests+correctness > $OUT/run.log 2>&1
# e2e 16: the same with the floor off with EAGLE's chain (tests/gpu/test_sglang_e2e.py's kimi
# family as committed next to this folder) and a longer tests limit:
E2E_CONFIGS=kimi E2E_TIMEOUT=480 TESTS_TIMEOUT=440 SELFCHECK_TIMEOUT=120 timeout 585 \
  bash bench/sglang_gpu.sh tests+correctness > $OUT/run.log 2>&1
