#!/usr/bin/env bash
# On one H200 (device tool), #34 item 3's A/B: this tree (BASE) against VARIANT, a copy of it with
# scripts/cutlass/prompt_epilogues.patch applied: q/k rows reordered at load as RoPE pairs and gate/up rows
# interleaved; with RLT_CUTLASS_LIBS its prompt passes (128 rows or more) run the CUTLASS GEMMs
# (rlt/kernels/cutlass_gemm.py): q/k/v with RoPE and the K/V store as its epilogue (rlt_gemm_rope_d_kv), gate/up
# with SwiGLU. The patch's CPU suite passes on the commit it was cut from (apply it there and run it); if it wins,
# it lands and this script goes. Build the libraries here first (`bash scripts/cutlass/build.sh`; wheels:
# scripts/device_wheels.sh), then run with carry [".whl", "build"].
# PART=tests: VARIANT's GPU tests, prompt passes on the CUTLASS GEMMs (-k $K, default all);
# PART=prefill: lone prompts of 1,024 and 4,096 tokens against their dense floor (scripts/prefix_hit.py), BASE
#   and VARIANT with the libraries, interleaved, ROUNDS (default "1 2") over MODELS (default "ouro nb"; each
#   run ~35 s: one model a call keeps a call under 10 minutes);
# PART=decode: decode of Ouro-1.4B shapes at 1K, concurrency 1 and 128, BASE and VARIANT (its one-row GEMV and
#   q/k/v + RoPE launch read the reordered rows).
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
BASE=$PWD; TREE=/tmp/variant; LIBS=$PWD/build/cutlass
if [ ! -d $TREE ]; then
  mkdir -p $TREE && cp -r rlt tests scripts pyproject.toml $TREE/
  (cd $TREE && { git apply scripts/cutlass/prompt_epilogues.patch 2>/dev/null || patch -s -p1 < scripts/cutlass/prompt_epilogues.patch; }) \
    || { echo "the patch does not apply"; exit 1; }
fi
in_tree() { (cd "$1" && shift && PYTHONPATH=/tmp/site:$PWD "$@"); }
checkpoints() {  # the models named (ouro, nb), at the official shapes with random weights, unless there already
  for model in "$@"; do
    family=$model; [ $model = nb ] && family=nanbeige
    [ -d /tmp/$model ] || python3 -m rlt make-checkpoint --family $family --preset full --out /tmp/$model --device cuda \
      >/dev/null &
  done
  wait
}
for part in ${PART:-tests}; do  # (several: "tests decode")
case $part in
tests)
  step "GPU tests, prompt passes on the CUTLASS GEMMs"
  in_tree "$TREE" env RLT_CUTLASS_LIBS=$LIBS timeout ${TEST_TIMEOUT:-420} python3 -m pytest -m gpu -q -x -p no:cacheprovider \
    -p no:xdist tests/test_gpu_cutlass.py tests/test_gpu.py ${K:+-k "$K"} 2>&1 | tee "$OUT/pytest_gpu.log" | tail -15
  ;;
prefill)
  checkpoints ${MODELS:-ouro nb}
  for round in ${ROUNDS:-1 2}; do
    for model in ${MODELS:-ouro nb}; do
      for len in 1024 4096; do
        for variant in base variant; do
          tree=$BASE; libs=""
          [ $variant = variant ] && tree=$TREE && libs=$LIBS
          log="$OUT/prefill_${model}_${len}.log"
          echo "--- round $round $model $len $variant" >> "$log"
          in_tree "$tree" env RLT_CUTLASS_LIBS=$libs timeout 150 python3 scripts/prefix_hit.py --model /tmp/$model \
            --prefix-len 0 --new-len $len --repeat 5 >> "$log" 2>&1
          python3 - "$log" "$round $model $len $variant" <<'EOF'
import json, re, sys
text = open(sys.argv[1]).read().rsplit("--- round", 1)[1]
m = re.search(r"^\{.*?^\}", text, re.S | re.M)
r = json.loads(m.group(0)) if m else {}
print(f"{sys.argv[2]:28s} hit {r.get('hit_ms_median')} ms, floor {r.get('floor_ms')} ms: x{r.get('x_floor')}, "
      f"busy {r.get('profiled_gpu_busy_ms')} ms")
EOF
        done
      done
    done
  done
  ;;
decode)
  checkpoints ouro
  for round in ${ROUNDS:-1 2}; do
    for variant in base variant; do
      tree=$BASE; [ $variant = variant ] && tree=$TREE
      step "decode, Ouro-1.4B shapes, 1K context, concurrency 1 and 128: $variant (round $round)"
      in_tree "$tree" timeout 200 python3 -m rlt bench offline --model /tmp/ouro --device cuda --concurrency 1,128 \
        --threshold 1.0 --prompt-len 1024 --max-tokens 64 --kv-gib 120 --floors 2>&1 | tee -a "$OUT/decode_$variant.log" \
        | tail -4
    done
  done
  ;;
esac
done
