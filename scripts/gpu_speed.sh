#!/usr/bin/env bash
# On one H200 (device tool): install carried wheels, run the GPU tests, then the offline
# benchmark with in-run ceilings (Ouro-1.4B decode, Nanbeige4.2-3B prefill), a GPU profile of
# decode steps and, with SERVE_TOPOS (e.g. "2x 1p1d", on nvidia-h200-x2), the PD serving benchmark
# (docs/performance.md). Logs and JSON go to $OUT. Everything at once runs past one device call (10 min):
# split it, e.g. PROFILE=0 first, then SKIP_TESTS=1 BENCH=0 NB=0 for the profiles.
# Switches: SKIP_TESTS PYTEST_K TEST_TIMEOUT TEST_PDL (GPU tests with RLT_PDL, default 1); OURO NB
# BENCH CONC THR KV_GIB CONC4K PREFILL_LENS BENCH_TIMEOUT BENCH_ARGS (more `rlt bench offline` arguments, e.g.
# "--kernels reference"); PROFILE PROFILE_CONC PROFILE_THR PROFILE_STEADY (adaptive, always, never;
# several compare; default adaptive) PROFILE_PDL ("0 1" compares; default 1); SERVE_TOPOS RATES
# SWEEP_RATES DURATION SWEEP_DURATION SERVE_TIMEOUT SERVE_ARGS (e.g. "--max-local-prefill-length 256");
# COMMIT (recorded in the JSON; default: git rev-parse --short HEAD, where the tree has its .git).
# RLT_PDL set outside applies to the benchmarks.
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
COMMIT_ARG=${COMMIT:+--commit=$COMMIT}
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  # Alone on the machine: beside a benchmark on another GPU they slow it.
  step "pytest -m gpu"
  # the GPU tests run the kernels with programmatic dependent launch, the default (TEST_PDL=0: without)
  RLT_PDL=${TEST_PDL:-1} timeout ${TEST_TIMEOUT:-360} python3 -m pytest -m gpu -q -x -p no:cacheprovider -p no:xdist tests/test_gpu.py ${PYTEST_K:+-k "$PYTEST_K"} \
    2>&1 | tee "$OUT/pytest_gpu.log" | tail -15
fi
step "checkpoints (random bf16 weights at the official shapes, drawn on cuda)"
[ "${OURO:-1}" = 1 ] && python3 -m rlt make-checkpoint --family ouro --preset full --out /tmp/ouro-full --device cuda >/dev/null &
[ "${NB:-1}" = 1 ] && python3 -m rlt make-checkpoint --family nanbeige --preset full --out /tmp/nb-full --device cuda >/dev/null
wait
if [ "${OURO:-1}" = 1 ] && [ "${BENCH:-1}" = 1 ]; then
  step "offline decode, Ouro-1.4B shapes, 1K context, with ceilings"
  timeout ${BENCH_TIMEOUT:-240} python3 -m rlt bench offline --model /tmp/ouro-full --device cuda --concurrency ${CONC:-1,16,64,128} \
    --threshold ${THR:-1.0,0.5} --prompt-len 1024 --max-tokens 64 --kv-gib ${KV_GIB:-120} --floors --json-out "$OUT/bench_ouro.json" \
    $COMMIT_ARG ${BENCH_ARGS:-} \
    2>&1 | tee "$OUT/bench_ouro.log" | tail -12
  if [ -n "${CONC4K-1,16,32}" ]; then
    step "offline decode, Ouro-1.4B shapes, 4K context"
    timeout ${BENCH_TIMEOUT:-240} python3 -m rlt bench offline --model /tmp/ouro-full --device cuda --concurrency ${CONC4K-1,16,32} \
      --threshold ${THR:-1.0,0.5} --prompt-len 4096 --max-tokens 64 --kv-gib ${KV_GIB:-120} --floors \
      --json-out "$OUT/bench_ouro_4k.json" $COMMIT_ARG ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_ouro_4k.log" | tail -8
  fi
fi
if [ "${NB:-1}" = 1 ] && [ -n "${PREFILL_LENS-1024,4096}" ]; then  # PREFILL_LENS="": checkpoint only (serving)
  step "prefill, Nanbeige4.2-3B shapes, with the dense floor"
  timeout 150 python3 -m rlt bench offline --model /tmp/nb-full --device cuda --concurrency "" --prefill-lens ${PREFILL_LENS-1024,4096} \
    --floors --json-out "$OUT/bench_nb_prefill.json" $COMMIT_ARG ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_nb_prefill.log" | tail -4
fi
if [ "${PROFILE:-1}" = 1 ] && [ "${OURO:-1}" = 1 ]; then
  for c in ${PROFILE_CONC:-1 128}; do
    for thr in ${PROFILE_THR:-1.0 0.5}; do
      step "GPU profile of decode steps, concurrency $c, threshold $thr (steady decode ${PROFILE_STEADY:-adaptive}, PDL ${PROFILE_PDL:-1})"
      for steady in ${PROFILE_STEADY:-adaptive}; do
        for pdl in ${PROFILE_PDL:-1}; do
          RLT_PDL=$pdl timeout 150 python3 scripts/profile_gpu.py --model /tmp/ouro-full --concurrency $c --threshold $thr \
            --kv-gib ${KV_GIB:-120} --steady-decode $steady --json-out "$OUT/profile_c${c}_t${thr}_s${steady}_p$pdl.json" \
            2>&1 | tee "$OUT/profile_c${c}_t${thr}_s${steady}_p$pdl.log" | tail -34
        done
      done
    done
  done
fi
for topo in ${SERVE_TOPOS:-}; do
  # P4: prompts alternating 128 and 4096 tokens, 64 output tokens, greedy, EOS ignored, Poisson
  # arrivals; 1P1D against two single-GPU replicas with the same per-worker KV pool.
  step "serving $topo, Nanbeige4.2-3B shapes, rates ${RATES:-0.25,0.5,1} x ${DURATION:-60} s"
  timeout ${SERVE_TIMEOUT:-400} python3 -m rlt bench serve --model /tmp/nb-full --device cuda --topology $topo \
    --rates ${RATES:-0.25,0.5,1} --sweep-rates "${SWEEP_RATES:-}" --duration ${DURATION:-60} --sweep-duration ${SWEEP_DURATION:-${DURATION:-60}} \
    --prompt-lens 128,4096 --output-len 64 \
    --kv-gib 40 $COMMIT_ARG ${SERVE_ARGS:-} --json-out "$OUT/serve_$topo.json" 2>&1 | grep -v "NIXL INFO" | tee "$OUT/serve_$topo.log" | tail -16
done
# P4's verdict when both topologies ran here (else: compare_serving.py on the two JSON files)
[ -f "$OUT/serve_1p1d.json" ] && [ -f "$OUT/serve_2x.json" ] && python3 scripts/compare_serving.py "$OUT/serve_1p1d.json" "$OUT/serve_2x.json"
