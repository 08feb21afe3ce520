# at 220bc84, on the GPU machine (carry: .sglsite .gpucache)
E2E_CONFIGS="eagle-fp8 dflash" E2E_TIMEOUT=450 bash bench/sglang_gpu.sh correctness > $OUT/run.log 2>&1
