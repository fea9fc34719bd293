// #34 item 3 experiment (scripts/cutlass/build.sh, check.py): a CUTLASS 3 SM90 TMA warp-specialized bf16 GEMM
// (D = A @ B^T); TILE_M, TILE_N and PINGPONG choose its tiling and schedule.
#include "common.cuh"

#ifndef TILE_M
#define TILE_M 128
#define TILE_N 128
#endif
#ifdef PINGPONG  // (two consumer warp groups on two tiles, alternating; the epilogue schedule to match)
using Plain = rlt::Gemm<Shape<Int<TILE_M>, Int<TILE_N>, _64>, rlt::Bf, rlt::Bf,
                        cutlass::epilogue::fusion::LinearCombination<rlt::Bf, float>,
                        cutlass::epilogue::TmaWarpSpecialized, cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
#else
using Plain = rlt::Gemm<Shape<Int<TILE_M>, Int<TILE_N>, _64>, rlt::Bf, rlt::Bf,
                        cutlass::epilogue::fusion::LinearCombination<rlt::Bf, float>>;
#endif

extern "C" int rlt_gemm(int M, int N, int K, const void* A, const void* B, void* D, int sms, void* stream) {
    auto args = Plain::arguments(M, N, K, A, B, D, sms);
    args.epilogue.thread = {1.f, 0.f};  // (D = A B^T: C, at D, unread)
    return Plain::run(args, stream);
}
