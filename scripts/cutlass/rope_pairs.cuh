// RoPE on adjacent column pairs as a CUTLASS 3 SM90 epilogue-visitor node (gemm_rope.cu, gemm_rope_kv.cu): for
// q/k rows permuted so each head's rotate-half pairs are adjacent, theta = pos[row] * freq[col] (freq 0 on v's
// columns). The accumulator is rounded to bf16 first, then rotated in float32 and rounded: as the GEMM then
// rope.py would.
#pragma once
#include "common.cuh"

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

namespace rlt {
namespace fu = cutlass::epilogue::fusion;
using Freq = fu::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, int64_t>>;
using Pos = fu::Sm90ColBroadcast<0, TileShape, int64_t, float, Stride<_1, _0, int64_t>>;  // (positions as the engine's)
using Rope = fu::Sm90EVT<fu::Sm90Compute<RopePairs, Bf, float, cutlass::FloatRoundStyle::round_to_nearest>,
                         fu::Sm90AccFetch, Freq, Pos>;

// The Rope node's arguments: freq [N] (float32), pos [M] (int64).
inline auto rope_arguments(const float* freq, const int64_t* pos) {
  return typename Rope::Arguments{{}, {freq, 0.f, {_0{}, _1{}, 0}}, {pos, int64_t(0), {_1{}, _0{}, 0}}, {}};
}
}  // namespace rlt
