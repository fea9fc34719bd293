// #34 item 3 experiment (scripts/cutlass/build.sh builds it, check.py runs it).
// A CUTLASS 3 SM90 bf16 GEMM (D = A @ B^T) whose epilogue rotates adjacent column pairs (rope_pairs.cuh).
#include "rope_pairs.cuh"

using RopeGemm = rlt::Gemm<rlt::TileShape, void, rlt::Bf, rlt::Rope>;

// D [M, N] = rope(A [M, K] @ B [N, K]^T): freq [N] (float32), pos [M] (int64).
extern "C" int rlt_gemm_rope(int M, int N, int K, const void* A, const void* B, void* D, const float* freq,
                             const int64_t* pos, int sms, void* stream) {
    auto args = RopeGemm::arguments(M, N, K, A, B, D, sms);
    args.epilogue.thread = rlt::rope_arguments(freq, pos);
    return RopeGemm::run(args, stream);
}
