# Device command: A/B (main, main again for the noise floor, s-chains), then per-SASS-instruction
# stall sampling of main's attention kernel at a compute-bound and a memory-heavy shape.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD/.stubs KDTREE_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
R=/tmp/run14; mkdir -p $R
OUT=$R bash bench/ab_kernels.sh run; rc=$?
export PYTHONPATH=$PWD/ab/main/kernel:$PWD/services/inference:$PYTHONPATH KDTREE_BUILD_DIR=/tmp/ab-build/main
for shape in "1 128 16 32768" "1 8 8 32768"; do
  read -r b h t l <<<"$shape"
  rep=$R/src_B${b}_H${h}_T${t}_L${l}
  ncu --clock-control none --kernel-name regex:attention_kernel --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --import-source yes -o $rep \
    python3 bench/profile_kernel.py --batch $b --heads $h --draft $t --prefix $l > $rep.ncu.log 2>&1
  ncu -i $rep.ncu-rep --page source --csv --print-source sass > $rep.sass.csv 2> $rep.sass.err
  ncu -i $rep.ncu-rep --page details > $rep.details.txt 2>&1
  wc -l $rep.sass.csv; head -c 600 $rep.sass.csv; cat $rep.sass.err | head -5
done
tar -czf $OUT/run14.tgz -C /tmp run14
exit $rc
