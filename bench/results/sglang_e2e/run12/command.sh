# On the GPU machine (carry: .sglsite .gpucache), one configuration family per command.
# dflash, at 06f2ed5: its validate==off check compared whole records, wall-clock timing included
# (the fix, at 464e55a, compares what was served; correctness.json's served-only check is in the
# journal line):
E2E_CONFIGS="dflash" E2E_TIMEOUT=480 bash bench/sglang_gpu.sh correctness > $OUT/run.log 2>&1
# kimi, at 06f2ed5 plus that fix:
E2E_CONFIGS="kimi" E2E_TIMEOUT=520 bash bench/sglang_gpu.sh correctness > $OUT/run.log 2>&1
# eagle-fp8, at 464e55a, with a cut resolution grid next to it (stopped by the 10-minute limit
# after three candidates: resolution_partial.log):
(E2E_CONFIGS="eagle-fp8" E2E_TIMEOUT=450 bash bench/sglang_gpu.sh correctness > $OUT/run.log 2>&1 &)
sleep 50; RESOLUTION_SIZES=40 RESOLUTION_FAULTS="scale:0.01,tree_mask:3" timeout 480 \
  bash bench/sglang_gpu.sh resolution > $OUT/run_resolution.log 2>&1
