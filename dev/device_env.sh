# The GPU machine's setup (the device tool), sourced by a command or a script there after
# `set -uo pipefail`: the repository root as the working folder, $OUT (what comes back), the
# carried wheels (.whl/, made here by dev/device_wheels.sh) installed into /tmp/site, rlt's
# environment there, and step() to mark each part of the log. A typical call (carry .whl):
#   . dev/device_env.sh
#   step tests; python3 -m pytest -m gpu -q -x -p no:cacheprovider -p no:xdist \
#       tests/kernels/test_gpu_kernels.py tests/workers/test_gpu_engine.py
#   python3 -m rlt make-checkpoint --family ouro --preset full --out /tmp/ouro-full --device cuda
#   step bench; python3 -m rlt bench offline --model /tmp/ouro-full --device cuda --floors ...
# The measurements and their commands: docs/performance.md and `rlt bench --help`.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-/tmp/rlt-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 RLT_CACHE_DIR=/tmp/rltcache
step() { echo "=== $1 ($(date +%T))"; }
