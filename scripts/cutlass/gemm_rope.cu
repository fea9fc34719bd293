// #34 item 3 experiment (scripts/cutlass/build.sh builds it, check.py runs it).
// A CUTLASS 3 SM90 bf16 GEMM (D = A @ B^T) whose epilogue rotates adjacent column pairs (RoPE with each
// head's q/k rows permuted so rotate-half pairs are adjacent): theta = pos[row] * freq[col] (freq 0 on v's columns).
// The accumulator is rounded to bf16 first, then rotated in float32 and rounded: as the GEMM then rope.py would.
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
template <class T> struct RopePairs {};  // (a tag: the node below does the work)
}

namespace cutlass::epilogue::fusion {
template <class ElementOutput, class ElementCompute, FloatRoundStyle RoundStyle>
struct Sm90Compute<rlt::RopePairs, ElementOutput, ElementCompute, RoundStyle> : Sm90VisitorImpl<> {
  using Sm90VisitorImpl<>::Sm90VisitorImpl;
  struct ConsumerStoreCallbacks : EmptyConsumerStoreCallbacks {
    template <typename ElementAccumulator, typename EA, typename EF, typename EP, int FragmentSize>
    CUTLASS_DEVICE Array<ElementOutput, FragmentSize>
    visit(Array<ElementAccumulator, FragmentSize> const& frg_acc, int epi_v, int epi_m, int epi_n,
          Array<EA, FragmentSize> const& acc, Array<EF, FragmentSize> const& freq, Array<EP, FragmentSize> const& pos) {
      static_assert(FragmentSize % 2 == 0, "pairs of adjacent columns");
      Array<ElementOutput, FragmentSize> out;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; i += 2) {
        float a = float(ElementOutput(acc[i])), b = float(ElementOutput(acc[i + 1]));
        float s, c;
        sincosf(float(pos[i]) * float(freq[i]), &s, &c);
        out[i] = ElementOutput(a * c - b * s);
        out[i + 1] = ElementOutput(b * c + a * s);
      }
      return out;
    }
  };
  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(ConsumerStoreArgs<Args...> const& args) {
    return ConsumerStoreCallbacks();
  }
};
}  // namespace cutlass::epilogue::fusion

using Bf = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutC = cutlass::layout::RowMajor;
using TileShape = Shape<_128, _128, _64>;
using ClusterShape = Shape<_1, _1, _1>;
namespace fu = cutlass::epilogue::fusion;
using Freq = fu::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, int64_t>>;
using Pos = fu::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, int64_t>>;
using Rope = fu::Sm90EVT<fu::Sm90Compute<rlt::RopePairs, Bf, float, cutlass::FloatRoundStyle::round_to_nearest>,
                         fu::Sm90AccFetch, Freq, Pos>;
using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutC, 8, Bf, LayoutC, 8,
    cutlass::epilogue::TmaWarpSpecializedCooperative, Rope>::CollectiveOp;
using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf, LayoutA, 8, Bf, LayoutB, 8, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
    CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

// D [M, N] = rope(A [M, K] @ B [N, K]^T): freq [N], pos [M] (float32).
extern "C" int rlt_gemm_rope(int M, int N, int K, const void* A, const void* B, void* D, const float* freq,
                             const float* pos, int sms, void* stream) {
    auto sA = cutlass::make_cute_packed_stride(typename GemmKernel::StrideA{}, {M, K, 1});
    auto sB = cutlass::make_cute_packed_stride(typename GemmKernel::StrideB{}, {N, K, 1});
    auto sD = cutlass::make_cute_packed_stride(typename GemmKernel::StrideD{}, {M, N, 1});
    cutlass::KernelHardwareInfo hw{0, sms};
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm, {M, N, K, 1},
                                  {(const Bf*)A, sA, (const Bf*)B, sB}, {{}, nullptr, {}, (Bf*)D, sD}, hw};
    args.epilogue.thread = {{}, {freq, 0.f, {_0{}, _1{}, 0}}, {pos, 0.f, {_1{}, _0{}, 0}}, {}};
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 1;
    if (Gemm::get_workspace_size(args) != 0) return 2;
    if (gemm.initialize(args, nullptr, (cudaStream_t)stream) != cutlass::Status::kSuccess) return 3;
    return gemm.run((cudaStream_t)stream) == cutlass::Status::kSuccess ? 0 : 4;
}
