// #34 item 3 experiment (scripts/cutlass/build.sh, check.py): a CUTLASS 3 SM90 TMA warp-specialized bf16 GEMM
// (D = A @ B^T); TILE_M, TILE_N and PINGPONG choose its tiling and schedule.
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/util/packed_stride.hpp"
using namespace cute;
using Bf = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutC = cutlass::layout::RowMajor;
#ifndef TILE_M
#define TILE_M 128
#define TILE_N 128
#endif
#ifdef PINGPONG  // (two consumer warp groups on two tiles, alternating; the epilogue schedule to match)
using MainloopSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
#else
using MainloopSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
#endif
using TileShape = Shape<Int<TILE_M>, Int<TILE_N>, _64>;
using ClusterShape = Shape<_1, _1, _1>;
using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, Bf, LayoutC, 8, Bf, LayoutC, 8,
    EpilogueSchedule>::CollectiveOp;
using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf, LayoutA, 8, Bf, LayoutB, 8, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    MainloopSchedule>::CollectiveOp;
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
    CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

extern "C" int rlt_gemm(int M, int N, int K, const void* A, const void* B, void* D, int sms, void* stream) {
    auto sA = cutlass::make_cute_packed_stride(typename GemmKernel::StrideA{}, {M, K, 1});
    auto sB = cutlass::make_cute_packed_stride(typename GemmKernel::StrideB{}, {N, K, 1});
    auto sC = cutlass::make_cute_packed_stride(typename GemmKernel::StrideC{}, {M, N, 1});
    auto sD = cutlass::make_cute_packed_stride(typename GemmKernel::StrideD{}, {M, N, 1});
    cutlass::KernelHardwareInfo hw{0, sms};
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm, {M, N, K, 1},
                                  {(const Bf*)A, sA, (const Bf*)B, sB},
                                  {{1.f, 0.f}, (const Bf*)D, sC, (Bf*)D, sD}, hw};
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 1;
    if (Gemm::get_workspace_size(args) != 0) return 2;
    if (gemm.initialize(args, nullptr, (cudaStream_t)stream) != cutlass::Status::kSuccess) return 3;
    return gemm.run((cudaStream_t)stream) == cutlass::Status::kSuccess ? 0 : 4;
}
