#!/usr/bin/env bash
# Speed of this tree against another commit's, side by side on one GPU (device tool): Ouro-1.4B
# shapes decode at concurrency 1 and 128 (1K context, fixed depth) and a Nanbeige4.2-3B 4096-token
# prefill, alternating base / new ROUNDS times. The base tree is `git archive BASE rlt scripts`
# unpacked into .base/ here before the call (carried: .base and .whl with the wheels of pyzmq and
# msgspec). Logs and JSON go to $OUT; the table is printed last.
#   git archive ec1016d rlt scripts | (rm -rf .base && mkdir .base && tar -x -C .base)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/rlt-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 RLT_CACHE_DIR=/tmp/rltcache
NEW=$PWD; BASE=$PWD/.base
PYTHONPATH=/tmp/site:$NEW python3 -m rlt make-checkpoint --family ouro --preset full --out /tmp/ouro-full --device cuda >/dev/null &
PYTHONPATH=/tmp/site:$NEW python3 -m rlt make-checkpoint --family nanbeige --preset full --out /tmp/nb-full --device cuda >/dev/null
wait
run() {  # tree label round
  local tree=$1 label=$2 n=$3 bench="python3 -m rlt bench offline"
  [ -f "$tree/scripts/bench.py" ] && bench="python3 scripts/bench.py"  # a base from before `rlt bench`
  echo "=== $label decode, round $n ($(date +%T))"
  (cd "$tree" && PYTHONPATH=/tmp/site:$tree timeout ${BENCH_TIMEOUT:-200} $bench --model /tmp/ouro-full \
    --device cuda --concurrency 1,128 --threshold 1.0 --prompt-len 1024 --max-tokens 64 --kv-gib 120 \
    --json-out "$OUT/decode_${label}_$n.json" 2>&1 | tail -3)
  echo "=== $label prefill, round $n ($(date +%T))"
  (cd "$tree" && PYTHONPATH=/tmp/site:$tree timeout 120 $bench --model /tmp/nb-full --device cuda \
    --concurrency "" --prefill-lens 4096 --json-out "$OUT/prefill_${label}_$n.json" 2>&1 | tail -2)
}
for n in $(seq 1 ${ROUNDS:-2}); do
  if [ $((n % 2)) = 1 ]; then run "$BASE" base $n; run "$NEW" new $n; else run "$NEW" new $n; run "$BASE" base $n; fi
done
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys
out = sys.argv[1]
def values(kind, label):
    got = {}
    for f in sorted(glob.glob(f"{out}/{kind}_{label}_*.json")):
        d = json.load(open(f))
        for r in d.get("rows", []):
            got.setdefault(f"decode conc {r['concurrency']} tok/s", []).append(r["decode_tok_per_s"])
        for p in d.get("prefill", []):
            got.setdefault(f"prefill {p['prompt_len']} ms", []).append(p["ms"])
    return got
base = values("decode", "base") | values("prefill", "base")
new = values("decode", "new") | values("prefill", "new")
print(f"{'metric':<26} {'base runs':<22} {'new runs':<22} {'new/base (medians)':>18}")
for k in base:
    b, n = base[k], new.get(k, [])
    ratio = statistics.median(n) / statistics.median(b) if b and n else float("nan")
    print(f"{k:<26} {str(b):<22} {str(n):<22} {ratio:>18.4f}")
PY
