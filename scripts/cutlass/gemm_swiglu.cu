// #34 item 3 experiment (scripts/cutlass/build.sh builds it, check.py runs it).
// The [gate; up] GEMM with SwiGLU as its epilogue, for weights whose gate and up rows are interleaved
// (row 2j: gate j, row 2j + 1: up j): each thread's accumulator fragment holds column pairs (2j, 2j + 1), so the
// epilogue computes silu(gate) * up per pair (rounded as rlt/kernels/gemv.py's SwiGLU epilogue) and stores it at
// column j of out [M, N / 2] itself (plain stores: the tile's TMA store of D is off, ElementD = void).
#include "common.cuh"

namespace rlt {
using namespace cutlass::epilogue::fusion;

struct SwigluArguments {
  Bf* ptr = nullptr;  // out [M, N / 2]
};

template <class ElementOut>
struct SwigluStore : StoreNode<SwigluArguments> {
  using ElementAux = ElementOut;  // (the epilogue's element in place of the absent D)
  using StoreNode<SwigluArguments>::StoreNode;

  template <class RTensor, class GTensor, class CTensor, class Residue>
  struct ConsumerStoreCallbacks : EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(RTensor&& r, GTensor&& g, CTensor c, Residue residue)
        : tC_r(cute::forward<RTensor>(r)), tC_g(cute::forward<GTensor>(g)), tC_c(c), residue(residue) {}
    RTensor tC_r;  // (CPY,CPY_M,CPY_N,EPI_M,EPI_N)
    GTensor tC_g;  // the same elements' places in out: a pair's two columns share one
    CTensor tC_c;
    Residue residue;

    template <typename ElementAccumulator, typename ElementInput, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<ElementOut, FragmentSize> visit(cutlass::Array<ElementAccumulator,
        FragmentSize> const&, int epi_v,
                                                         int epi_m, int epi_n,
                                                         cutlass::Array<ElementInput, FragmentSize> const& in) {
      static_assert(FragmentSize % 2 == 0, "pairs of adjacent columns");
      cutlass::Array<ElementOut, FragmentSize> out;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; i += 2) {
        float g = float(ElementOut(in[i])), u = float(ElementOut(in[i + 1]));
        float s = float(ElementOut(g / (1.f + __expf(-g))));
        out[i] = out[i + 1] = ElementOut(s * u);
      }
      Tensor frg = recast<cutlass::Array<ElementOut, FragmentSize>>(coalesce(tC_r(_, _, _, epi_m, epi_n)));
      frg(epi_v) = out;
      return out;
    }

    CUTLASS_DEVICE void end() {
      // a pair's product once: from its even column (tC_c counts from the thread's first element, itself on an
      // even column, so the parity is the column's)
      Tensor pred = cute::lazy::transform(
          tC_c, [&](auto const& c) { return elem_less(c, residue) && get<1>(c) % 2 == 0; });
      copy_if(pred, tC_r, tC_g);
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(ConsumerStoreArgs<Args...> const& args) {
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    int half = N / 2;
    auto layout = make_layout(make_shape(M, make_shape(_2{}, half), L),
                              make_stride(int64_t(half), make_stride(_0{}, _1{}), int64_t(M) * half));
    Tensor mO = make_tensor(make_gmem_ptr(params.ptr), layout);  // (M,N,L): column c -> c / 2
    Tensor gO = local_tile(mO, take<0, 2>(args.tile_shape_mnk), make_coord(m, n, l));
    Tensor tC_g = sm90_partition_for_epilogue<ReferenceSrc>(gO, args.epi_tile, args.tiled_copy, args.thread_idx);
    Tensor tC_r = make_tensor<ElementOut>(shape(tC_g));
    return ConsumerStoreCallbacks<decltype(tC_r), decltype(tC_g), decltype(args.tCcD), decltype(args.residue_tCcD)>(
        cute::move(tC_r), cute::move(tC_g), args.tCcD, args.residue_tCcD);
  }
};
}  // namespace rlt

using Swiglu = cutlass::epilogue::fusion::Sm90EVT<rlt::SwigluStore<rlt::Bf>, cutlass::epilogue::fusion::Sm90AccFetch>;
using SwigluGemm = rlt::Gemm<Shape<_128, _128, _64>, void, void, Swiglu>;

// out [M, N / 2] = swiglu(A [M, K] @ B [N, K]^T), B's rows gate and up interleaved.
extern "C" int rlt_gemm_swiglu(int M, int N, int K, const void* A, const void* B, void* out, int sms, void* stream) {
    auto args = SwigluGemm::arguments(M, N, K, A, B, nullptr, sms);
    args.epilogue.thread = {{}, {(rlt::Bf*)out}};
    return SwigluGemm::run(args, stream);
}
