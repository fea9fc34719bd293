#!/usr/bin/env bash
# On the GPU machine (device tool): install carried wheels, run the GPU tests, measure the KV
# handoff and check 1p1d against single for Nanbeige4.2-3B shapes. Logs and JSON go to $OUT.
# Speed (offline bench, profiles, serving) is scripts/gpu_speed.sh.
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
export NIXL_LOG_LEVEL=WARN
nvidia-smi -L | tee "$OUT/gpus.txt"
python3 -c "import torch, nixl, zmq, msgspec; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())"
git rev-parse --short HEAD 2>/dev/null | tee "$OUT/commit.txt"
step "pytest -m gpu"
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -p no:xdist tests/test_gpu.py 2>&1 | tee "$OUT/pytest_gpu.log" | tail -5
if [ "${SKIP_HANDOFF:-0}" != 1 ]; then
  step "KV handoff bandwidth, 4096-token Nanbeige prompt, cuda:0 -> cuda:1"
  timeout 240 python3 scripts/bench_kv_handoff.py --json-out "$OUT/handoff.json" 2>&1 | grep -v "NIXL INFO" | tee "$OUT/handoff.log"
fi
if [ "${SKIP_PARITY:-0}" != 1 ]; then
  step "Nanbeige full checkpoint (random bf16 weights, drawn on cuda)"
  t0=$(date +%s); python3 -m rlt make-checkpoint --family nanbeige --preset full --out /tmp/nb-full --device cuda >/dev/null; echo "made in $(( $(date +%s) - t0 )) s"
  step "1p1d vs single, bf16, prompts up to 4096 tokens, batch-invariant kernels"
  timeout 900 python3 scripts/pd_parity.py --model /tmp/nb-full --device cuda --dtype bfloat16 --batch-invariant \
    --json-out "$OUT/pd_parity_bi.json" 2>&1 | grep -v "NIXL INFO" | tee "$OUT/pd_parity_bi.log" | tail -40
fi
