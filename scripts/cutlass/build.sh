#!/usr/bin/env bash
# Builds the CUTLASS GEMMs here into self-contained sm_90a libraries (static cudart) with pip's CUDA 13.5 toolchain
# and CUTLASS 4.2's headers; no GPU needed (nvcc runs on the CPU; 1-3 min each, a core each). #34 item 3's
# experiment: scripts/cutlass/check.py runs them on the GPU machine (carry build/cutlass).
#   bash scripts/cutlass/build.sh [OUT=build/cutlass]
set -euo pipefail
SRC=$(cd "$(dirname "$0")" && pwd)
OUT=$(mkdir -p "${1:-build/cutlass}" && cd "${1:-build/cutlass}" && pwd)
TOOLS=${TOOLS:-/tmp/rlt-cuda-tools}
mkdir -p "$TOOLS/w" && cd "$TOOLS"
if [ ! -x cu/nvidia/cu13/bin/nvcc ]; then
  pip download -q --no-deps --only-binary=:all: nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-runtime nvidia-cuda-crt \
      nvidia-cuda-cccl nvidia-cutlass==4.2.0.0 -d w
  for f in w/nvidia_cuda*.whl w/nvidia_nvvm*.whl; do unzip -q -o "$f" -d cu; done
  unzip -q -o w/nvidia_cutlass-*.whl 'cutlass_library/source/include/*' 'cutlass_library/source/tools/util/include/*' -d ch
  chmod +x cu/nvidia/cu13/bin/* cu/nvidia/cu13/nvvm/bin/*
fi
C=ch/cutlass_library/source
build() {  # library source flags...: in the background, as many at once as there are cores
  local lib=$1 src=$2; shift 2
  rm -f "$OUT/$lib"
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do sleep 1; done
  cu/nvidia/cu13/bin/nvcc -arch=sm_90a -O3 -DNDEBUG -std=c++17 --shared -Xcompiler -fPIC -cudart static -w "$@" \
      -I $C/include -I $C/tools/util/include -o "$OUT/$lib" "$SRC/$src" &
}
LIBS="libgemm.so libgemm_pp64x128.so libgemm_coop128x256.so libgemm_rope.so libgemm_rope_kv.so libgemm_swiglu.so"
build libgemm.so gemm.cu
build libgemm_pp64x128.so gemm.cu -DPINGPONG -DTILE_M=64 -DTILE_N=128
build libgemm_coop128x256.so gemm.cu -DTILE_M=128 -DTILE_N=256
build libgemm_rope.so gemm_rope.cu
build libgemm_rope_kv.so gemm_rope_kv.cu
build libgemm_swiglu.so gemm_swiglu.cu
wait
for lib in $LIBS; do [ -f "$OUT/$lib" ] || { echo "$lib: the build failed" >&2; exit 1; }; done
