# On the GPU machine (carry: .sglsite and the compile caches of the command before), alone on the
# GPU, with bench/parity_resolution.py's --floor-chain and its table written after every cell:
RESOLUTION_SIZES=40 RESOLUTION_FAULTS="scale:0.01,tree_mask:3,kv_drop:16,weight:1:0.01,scale:0.001" \
  RESOLUTION_TIMEOUT=465 timeout 585 bash bench/sglang_gpu.sh resolution > $OUT/run.log 2>&1
