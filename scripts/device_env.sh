# Sourced by the GPU machine's scripts (device tool), after `set -uo pipefail`: the repository root as
# the working folder, $OUT (what comes back), the carried wheels (.whl/, scripts/device_wheels.sh)
# installed into /tmp/site, rlt's environment there, and step() to mark each part of the log.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-/tmp/rlt-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 RLT_CACHE_DIR=/tmp/rltcache
step() { echo "=== $1 ($(date +%T))"; }
