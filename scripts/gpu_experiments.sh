#!/usr/bin/env bash
# On one H200 (device tool), the two kernel experiments not yet run, in one call (~8 min):
# #36's persistent decode step (scripts/bench_megakernel.py: a 2-layer smoke run of each chain, then
# 24 layers over the ring configs) and #34 item 3's CUTLASS GEMMs with RoPE / SwiGLU epilogues
# (scripts/cutlass/check.py). Build the CUTLASS libraries here first (`bash scripts/cutlass/build.sh`,
# no GPU needed) and the wheels (scripts/device_wheels.sh), and carry them: carry [".whl", "build"]. Logs: $OUT.
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
step "megakernel smoke: 2 layers, each chain alone (a hang ends at the watchdog)"
for chain in products layers step; do
  timeout 120 python3 scripts/bench_megakernel.py --layers 2 --configs 6x32768x8 --chains $chain --watchdog 30 \
    2>&1 | tee -a "$OUT/megakernel_smoke.log" | tail -6
done
step "megakernel: 24 layers, four ring configs"
timeout ${MEGA_TIMEOUT:-300} python3 scripts/bench_megakernel.py ${MEGA_ARGS:-} 2>&1 | tee "$OUT/megakernel.log" | tail -20
if [ -d build/cutlass ]; then
  step "CUTLASS GEMMs against cuBLAS (+ the RoPE / SwiGLU launches) at the prefill shapes"
  for kind in plain rope rope_kv swiglu; do  # (a process each: a kernel's fault ends only its own checks)
    timeout 120 python3 scripts/cutlass/check.py --libs build/cutlass --only $kind 2>&1 | tee -a "$OUT/cutlass.log" \
      | tail -45
  done
else
  echo "no build/cutlass: run scripts/cutlass/build.sh here and carry build"
fi
