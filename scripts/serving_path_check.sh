#!/usr/bin/env bash
# #34's figures in one device call (nvidia-h200), each step under its own time limit, logs and JSON in
# $OUT, a summary last: the GPU tests, the general paged kernel by case (tune_paged), GQA packing end
# to end (pass_trace, Nanbeige4.2-3B), the prefix hits and lone prefills against their floors
# (prefix_hit), decode at concurrency 1 and 128 (rlt bench offline) and, with BASE (a source tree of
# another commit, e.g. `git worktree add .trees/base a6c23f0`, carried), the same decode there,
# interleaved; with STEPS naming http, HTTP against in process at 256 closed loops (serve_overhead.py), the
# clients starting at once and over RAMP s (default 0.5). Switches: STEPS (default "tests paged packs hits
# prefill decode"), TESTS (pytest's node ids, default tests/test_gpu.py), TEST_TIMEOUT, ROUNDS (decode's
# rounds, default "1 2").
set -uo pipefail
T0=$(date +%s)
. "$(dirname "$0")/device_env.sh"
step() { echo "=== $1 ($(( $(date +%s) - T0 )) s)"; }
has() { [[ " ${STEPS:-tests paged packs hits prefill decode} " == *" $1 "* ]]; }
python3 -m rlt make-checkpoint --family ouro --preset full --out /tmp/ouro --device cuda >/dev/null &
python3 -m rlt make-checkpoint --family nanbeige --preset full --out /tmp/nb --device cuda >/dev/null
wait
if has tests; then
  step "pytest -m gpu"
  timeout ${TEST_TIMEOUT:-400} python3 -m pytest -m gpu -q -x -p no:cacheprovider -p no:xdist \
    ${TESTS:-tests/test_gpu.py} 2>&1 | tee "$OUT/pytest_gpu.log" | tail -3
fi
if has paged; then
  step "tune_paged"
  timeout 120 python3 scripts/tune_paged.py --cases hit,chunk,mixed --block-n 64 --stages 0 > "$OUT/tune_paged.log" 2>&1
  grep -E "^(hit|chunk|mixed)|packing" "$OUT/tune_paged.log" | cut -c1-110
fi
if has packs; then
  step "pass_trace --packs gqa,1"
  timeout 200 python3 scripts/pass_trace.py --model /tmp/nb --values 1536 --streams 64 --prompt-len 1024 --output-len 128 \
    --requests 128 --packs gqa,1 --show 0 2>&1 | tee "$OUT/pass_trace.log" | grep -E "^(attention|decode_pass_rows)" | cut -c1-300
fi
summary() {  # prefix_hit's JSON -> one line
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], {k: r.get(k) for k in ('hit_ms_median','floor_ms','x_floor','profiled_gpu_busy_ms','idle_short_gaps_ms','profiled_timeline')})" "$@"
}
if has hits; then
  for m in nb ouro; do
    step "prefix hit, $m"
    timeout 80 python3 scripts/prefix_hit.py --model /tmp/$m --repeat 4 --json-out "$OUT/hit_$m.json" > "$OUT/hit_$m.log" 2>&1
    summary "$OUT/hit_$m.json" "hit $m"
  done
fi
if has prefill; then
  for m in ouro nb; do for n in 1024 4096; do
    step "prefill, $m $n"
    timeout 80 python3 scripts/prefix_hit.py --model /tmp/$m --prefix-len 0 --new-len $n --repeat 4 \
      --json-out "$OUT/prefill_${m}_$n.json" > "$OUT/prefill_${m}_$n.log" 2>&1
    summary "$OUT/prefill_${m}_$n.json" "prefill $m $n"
  done; done
fi
if has decode; then
  args="--model /tmp/ouro --device cuda --concurrency 1,128 --threshold 1.0 --prompt-len 1024 --max-tokens 64 --kv-gib 120"
  for round in ${ROUNDS:-1 2}; do
    step "decode, head ($round)"
    (cd /tmp && timeout 150 python3 -m rlt bench offline $args --floors > "$OUT/decode_head_$round.log" 2>&1)
    grep -A2 "^ conc" "$OUT/decode_head_$round.log"
    if [ -n "${BASE:-}" ]; then  # (an older tree: scripts/bench.py or rlt bench, whichever it has)
      step "decode, $BASE ($round)"
      base=$(cd "$BASE" && pwd)
      if [ -f "$base/scripts/bench.py" ]; then cmd="python3 $base/scripts/bench.py"; else cmd="python3 -m rlt bench offline"; fi
      (cd /tmp && PYTHONPATH=/tmp/site:$base timeout 150 $cmd $args > "$OUT/decode_base_$round.log" 2>&1)
      grep -A2 "conc" "$OUT/decode_base_$round.log" | tail -3
    fi
  done
fi
if has http; then
  for ramp in 0 ${RAMP:-0.5}; do
    step "HTTP against in process, 256 closed loops, ramp $ramp s"
    timeout 300 python3 scripts/serve_overhead.py --model /tmp/ouro --device cuda --concurrency 256 --rates "" \
      --prompt-len 256 --output-len 128 --rounds 1 --ramp $ramp --json-out "$OUT/http_ramp$ramp.json" \
      > "$OUT/http_ramp$ramp.log" 2>&1
    tail -2 "$OUT/http_ramp$ramp.log"
  done
fi
step done
