// #34 item 3 experiment (scripts/cutlass/build.sh builds it, check.py runs it).
// The q/k/v GEMM with RoPE on adjacent column pairs (rope_pairs.cuh) whose epilogue writes k and v straight into
// the paged KV cache at each row's slot (as rope.py's store does after the product), with no second launch reading
// them back. rlt_gemm_rope_kv stores q alone into Q [M, q_cols] (no [M, N] output: a pass whose attention reads
// the cache); rlt_gemm_rope_d_kv stores all of q, k, v into D [M, N] too, by the tile's TMA store (a lone prompt's
// dense attention reads k and v there). The cache's layer is given by its pointer; a slot's block is
// slot / block_size, its row in the block slot % block_size, k then v at stride_kv.
#include "rope_pairs.cuh"

namespace rlt {
using namespace cutlass::epilogue::fusion;

struct QkvArguments {
  Bf* q = nullptr;             // [M, q_cols]; none: D holds q
  Bf* cache = nullptr;         // at the layer: element (block, pos, kv) at block * stride_block + ...
  const int64_t* slots = nullptr;  // [M]
  int q_cols = 0, kv_cols = 0, block_size = 16;
  int64_t stride_block = 0, stride_pos = 0, stride_kv = 0;
};

template <class ElementOut>
struct QkvStore : StoreNode<QkvArguments> {
  using ElementAux = ElementOut;  // (the epilogue's element in place of the absent D)
  using StoreNode<QkvArguments>::StoreNode;

  template <class RTensor, class CTensor, class Residue>
  struct ConsumerStoreCallbacks : EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(RTensor&& r, CTensor c, Residue residue, QkvArguments const& a, int m0,
                                          int n0)
        : tC_r(cute::forward<RTensor>(r)), tC_c(c), residue(residue), a(a), m0(m0), n0(n0) {}
    RTensor tC_r;  // (CPY,CPY_M,CPY_N,EPI_M,EPI_N): the tile's results, stored at end()
    CTensor tC_c;  // the same elements' coordinates from the thread's first
    Residue residue;
    QkvArguments a;
    int m0, n0;  // the thread's first element's row and column

    template <typename ElementAccumulator, typename ElementInput, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<ElementOut, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
        cutlass::Array<ElementInput, FragmentSize> const& in) {
      cutlass::Array<ElementOut, FragmentSize> out;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) out[i] = ElementOut(in[i]);
      Tensor frg = recast<cutlass::Array<ElementOut, FragmentSize>>(coalesce(tC_r(_, _, _, epi_m, epi_n)));
      frg(epi_v) = out;
      return out;
    }

    // Where column col of row `row` goes: Q, or the cache at the row's slot (k, then v).
    // (q's columns: only with a.q)
    CUTLASS_DEVICE ElementOut* place(int row, int col) const {
      if (col < a.q_cols) return (ElementOut*)a.q + (int64_t)row * a.q_cols + col;
      const int64_t s = a.slots[row];
      const int c = col - a.q_cols, is_v = c >= a.kv_cols;
      return (ElementOut*)a.cache + (s / a.block_size) * a.stride_block + (s % a.block_size) * a.stride_pos +
             is_v * a.stride_kv + (c - is_v * a.kv_cols);
    }

    CUTLASS_DEVICE void end() {
      // two by two in the logical order tC_r and tC_c share (static indices: no local memory): a pair of
      // neighbouring columns of one row, as the accumulator's layout holds them, goes as one 4-byte store
      static_assert(size(RTensor{}) % 2 == 0);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(tC_r); i += 2) {
        auto c = tC_c(i), d = tC_c(i + 1);
        const int row = m0 + get<0>(c), col = n0 + get<1>(c), col_d = n0 + get<1>(d);
        // (without a.q, q's columns are D's alone; q_cols is even, so a pair is q's or not)
        const bool in_c = (a.q != nullptr || col >= a.q_cols) && elem_less(c, residue);
        const bool in_d = (a.q != nullptr || col_d >= a.q_cols) && elem_less(d, residue);
        if (in_c && in_d && get<0>(d) == get<0>(c) && col_d == col + 1 && col % 2 == 0) {
          cutlass::Array<ElementOut, 2> two;
          two[0] = tC_r(i), two[1] = tC_r(i + 1);
          *reinterpret_cast<cutlass::Array<ElementOut, 2>*>(place(row, col)) = two;
        } else {
          if (in_c) *place(row, col) = tC_r(i);
          if (in_d) *place(m0 + get<0>(d), col_d) = tC_r(i + 1);
        }
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(ConsumerStoreArgs<Args...> const& args) {
    // tCcD counts from this thread's first element, and residue_tCcD is (M, N) less that element's place
    // (sm90_epilogue_tma_warpspecialized.hpp: make_coord_tensor, residue_tRS_cD): so that place is
    // (M, N) - residue_tCcD, and an element's, that plus its tCcD coordinate
    auto [M, N, K, L] = args.problem_shape_mnkl;
    Tensor tC_r = make_tensor<ElementOut>(shape(args.tCcD));
    const int m0 = M - get<0>(args.residue_tCcD), n0 = N - get<1>(args.residue_tCcD);
    return ConsumerStoreCallbacks<decltype(tC_r), decltype(args.tCcD), decltype(args.residue_tCcD)>(
        cute::move(tC_r), args.tCcD, args.residue_tCcD, params, m0, n0);
  }
};

using QkvRope = Sm90EVT<QkvStore<Bf>, Rope>;
template <class ElementD>
using QkvRopeGemm = Gemm<TileShape, void, ElementD, QkvRope>;

template <class ElementD>
int qkv_rope_kv(int M, int N, int K, const void* A, const void* B, void* D, void* q, void* cache,
                const int64_t* slots, const float* freq, const int64_t* pos, int q_cols, int block_size,
                long long stride_block, long long stride_pos, long long stride_kv, int sms, void* stream) {
    using G = QkvRopeGemm<ElementD>;
    auto args = G::arguments(M, N, K, A, B, D, sms);
    QkvArguments store{(Bf*)q, (Bf*)cache, slots, q_cols, (N - q_cols) / 2, block_size, stride_block, stride_pos,
                       stride_kv};
    args.epilogue.thread = {rope_arguments(freq, pos), store};
    return G::run(args, stream);
}
}  // namespace rlt

// rope(A [M, K] @ B [N, K]^T), N = q_cols + 2 kv_cols: q into q [M, q_cols], k and v into the cache at slots;
// freq [N] (float32), pos and slots [M] (int64); cache at the layer, strides in elements.
extern "C" int rlt_gemm_rope_kv(int M, int N, int K, const void* A, const void* B, void* q, void* cache,
                                const int64_t* slots, const float* freq, const int64_t* pos, int q_cols,
                                int block_size, long long stride_block, long long stride_pos, long long stride_kv,
                                int sms, void* stream) {
    return rlt::qkv_rope_kv<void>(M, N, K, A, B, nullptr, q, cache, slots, freq, pos, q_cols, block_size,
                                  stride_block, stride_pos, stride_kv, sms, stream);
}

// The same with all of it into D [M, N] as well (q not stored apart).
extern "C" int rlt_gemm_rope_d_kv(int M, int N, int K, const void* A, const void* B, void* D, void* cache,
                                  const int64_t* slots, const float* freq, const int64_t* pos, int q_cols,
                                  int block_size, long long stride_block, long long stride_pos, long long stride_kv,
                                  int sms, void* stream) {
    return rlt::qkv_rope_kv<rlt::Bf>(M, N, K, A, B, D, nullptr, cache, slots, freq, pos, q_cols, block_size,
                                     stride_block, stride_pos, stride_kv, sms, stream);
}
