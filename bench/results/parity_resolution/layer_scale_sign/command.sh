# Does a one-layer 2% output scale push the chosen tokens' logprobs one way? With the
# parity code of 9231127, on this machine's CPU (the reference engines) and on
# e2e 57's stored answers (real SGLang servers, bench/results/sglang_e2e/run57/resolution.tar.xz).
# 1. The reference engines, 24 prompts of short, against the kv-splits floor (14 s):
PYTHONPATH=bench .venv/bin/python -m kdtree_bench.e2e.parity_resolution --out /tmp/reslab \
  --corpus-sizes 24 --faults layer_scale:1:0.02 --policy short --floor-kv-splits 3 --no-controls
# 2. Per store: on the tokens the candidate (or the floor) shares with the baseline, the signed
#    change of each token's logprob, and a two-sided sign test (analysis.log):
signed() {  # signed STORE RUN_ID
  sqlite3 "$1" "select result_json from results where run_id='$2'" | python3 -c '
import json, sys
import numpy as np
from scipy import stats
rows = [json.loads(line) for line in sys.stdin]
for role in ("candidate", "floor"):
    d = []
    for r in rows:
        b = r["outcomes"]["baseline"]["generation"]; c = r["outcomes"][role]["generation"]
        n = 0
        while n < min(len(b["output_ids"]), len(c["output_ids"])) and b["output_ids"][n] == c["output_ids"][n]:
            n += 1
        d += list(np.array(c["token_logprobs"][:n]) - np.array(b["token_logprobs"][:n]))
    d = np.array(d); nz = d[d != 0]
    p = stats.binomtest(int((nz > 0).sum()), len(nz)).pvalue if len(nz) else 1.0
    print(f"{role}: {len(d)} positions, mean {d.mean():.5f}, median |d| {np.median(abs(d)):.5f}, "
          f"up {(d > 0).sum()} down {(d < 0).sum()}, sign test p {p:.3g}")'
}
tar xJf /tmp/reslab/raw.tar.xz -C /tmp/reslab
echo "reference engines (run $(sqlite3 /tmp/reslab/raw/runs.sqlite3 'select id from runs'))"
signed /tmp/reslab/raw/runs.sqlite3 "$(sqlite3 /tmp/reslab/raw/runs.sqlite3 'select id from runs')"
mkdir -p /tmp/r57 && tar xJf bench/results/sglang_e2e/run57/resolution.tar.xz -C /tmp/r57 \
  && tar xJf /tmp/r57/resolution/raw.tar.xz -C /tmp/r57/resolution
echo "SGLang, e2e 57's layer_scale:1:0.02 cell (run 20261206-063925-9e54ac)"
signed /tmp/r57/resolution/raw/runs.sqlite3 20261206-063925-9e54ac
