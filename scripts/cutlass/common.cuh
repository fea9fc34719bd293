// What scripts/cutlass's GEMMs share: D = A [M, K] @ B [N, K]^T in bf16 with float32 sums, A row-major, B a
// weight's rows (column-major K x N), D row-major; CUTLASS 3's SM90 TMA warp-specialized kernel, one CTA a cluster.
#pragma once
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/util/packed_stride.hpp"
using namespace cute;

namespace rlt {
using Bf = cutlass::bfloat16_t;
using TileShape = Shape<_128, _128, _64>;  // (the fused GEMMs' tile)
using Cooperative = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using CooperativeEpilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;

// The kernel for a tile, C and D elements (void: none), the epilogue's fusion and the schedules.
template <class TileShape, class ElementC, class ElementD, class Fusion, class EpilogueSchedule = CooperativeEpilogue,
          class MainloopSchedule = Cooperative>
struct Gemm {
  using RowMajor = cutlass::layout::RowMajor;
  using ClusterShape = Shape<_1, _1, _1>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, RowMajor, 8, ElementD, RowMajor, 8,
      EpilogueSchedule, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf, RowMajor, 8, Bf, cutlass::layout::ColumnMajor, 8,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using Arguments = typename Adapter::Arguments;

  // The problem's arguments, the epilogue's thread arguments left for the caller; D (and C) at D.
  static Arguments arguments(int M, int N, int K, const void* A, const void* B, void* D, int sms) {
    auto sA = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, {M, K, 1});
    auto sB = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, {N, K, 1});
    auto sC = cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, {M, N, 1});
    auto sD = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, {M, N, 1});
    using PtrC = typename Kernel::CollectiveEpilogue::ElementC const*;
    using PtrD = typename Kernel::CollectiveEpilogue::ElementD*;
    return {cutlass::gemm::GemmUniversalMode::kGemm, {M, N, K, 1}, {(const Bf*)A, sA, (const Bf*)B, sB},
            {{}, (PtrC)D, sC, (PtrD)D, sD}, cutlass::KernelHardwareInfo{0, sms}};
  }

  // 0, or the step that failed: 1 cannot implement, 2 wants a workspace, 3 initialize, 4 run.
  static int run(Arguments const& args, void* stream) {
    Adapter gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 1;
    if (Adapter::get_workspace_size(args) != 0) return 2;
    if (gemm.initialize(args, nullptr, (cudaStream_t)stream) != cutlass::Status::kSuccess) return 3;
    return gemm.run((cudaStream_t)stream) == cutlass::Status::kSuccess ? 0 : 4;
  }
};

// What an epilogue-visitor node that stores its own results (ElementD = void: no TMA store) needs besides its
// consumer callbacks: Args, its arguments as its parameters; no shared memory, workspace or loads.
template <class Args>
struct StoreNode {
  struct SharedStorage {};
  using Arguments = Args;
  using Params = Args;
  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) { return args; }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) { return true; }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) { return 0; }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }
  CUTLASS_HOST_DEVICE StoreNode() {}
  CUTLASS_HOST_DEVICE StoreNode(Params const& params, SharedStorage const&) : params(params) {}
  Params params;
  template <class... Ts>
  CUTLASS_DEVICE auto get_producer_load_callbacks(cutlass::epilogue::fusion::ProducerLoadArgs<Ts...> const&) {
    return cutlass::epilogue::fusion::EmptyProducerLoadCallbacks{};
  }
};
}  // namespace rlt
