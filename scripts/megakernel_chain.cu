// One persistent launch for a decode loop step at one row (#36's loop-step kernel, an experiment):
// a chain of stages, each reading the previous ones' outputs. Stage kinds:
//   GEMV   act[out:out+N] = W @ x, x = act[in:in+K] as given (PLAIN), after the engine's add + RMSNorm
//          (ADD_NORM: Ouro's sandwich, r' = r + rms_norm(x, wa), x = rms_norm(r', wo)) or SwiGLU
//          (SWIGLU: silu(act[in:]) * act[in + inter:]), rounded as rlt/kernels/norm.py and gemv.py;
//   ATTN   the decode attention at position pos of q = act[in:in+H*D] (k, v after it) over a contiguous
//          K/V cache ([2][H][ctx][D], bf16), q and the new k rotated (rotate-half RoPE, rounded as
//          rlt/kernels/rope.py) and the new k, v stored at pos by the item whose slice holds it: an item
//          per (head, slice of R keys) leaves its softmax partials (m, l, acc) in fpart;
//   MERGE  an item per head merges its slices into act[out + h*D:] (bf16).
// Weights and cached keys never depend on the chain, so each block's producer warp streams its
// share of every stage's bytes into a shared-memory ring (1-D bulk copies, mbarriers) waiting for
// nothing but a free slot, while its consumer warps wait on the previous stage's completion
// counter only when they start a stage, then work on bytes already on chip: the chain's waits
// overlap the stream instead of following it.
//
// Work: each stage cut into chunks (GEMV: rows_of[p] rows of at most STAGE_BYTES; ATTN: a head's
// slice; MERGE: a head), numbered through the chain in order; block b takes chunks b, b + G, ...
// (every block meets the stages in order: none waits on work queued behind its own). A block adds
// its count of a stage's chunks to done[p] once, after its last (one fence a stage). All blocks
// must be resident at once (grid <= SMs, one block an SM).
//
// Built by scripts/bench_megakernel.py with torch.cuda._compile_kernel (NVRTC); STAGES,
// STAGE_BYTES and CW (consumer warps) come in as macros.

#define THREADS ((CW + 1) * 32)
#define MAXV 4      // 16-byte vectors of x a lane holds: K <= MAXV * 8 * 32 * CW
#define D 128       // head dimension
#define Q_MAX 2048  // q elements of an attention stage (kept as floats in shared memory)
#define R_MAX 128   // keys an attention item holds
#define NEG_INF (-__int_as_float(0x7f800000))

enum { GEMV = 0, ATTN = 1, MERGE = 2 };
enum { PLAIN = 0, ADD_NORM = 1, SWIGLU = 2 };

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    unsigned done = 0;
    while (!done) {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(smem_addr(bar)), "r"(parity)
            : "memory");
    }
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}
__device__ __forceinline__ int load_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void consumers_sync() {  // the consumer warps only (the producer runs on)
    asm volatile("bar.sync 1, %0;" ::"r"(CW * 32) : "memory");
}
__device__ __forceinline__ float bf_lo(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float bf(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ unsigned short to_bf16(float f) {  // round to nearest even (finite values)
    unsigned u = __float_as_uint(f);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float round_bf16(float f) { return bf(to_bf16(f)); }
__device__ __forceinline__ void unpack8(uint4 v, float* out) {
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        out[2 * e] = bf_lo(u[e]);
        out[2 * e + 1] = bf_hi(u[e]);
    }
}
__device__ __forceinline__ float dot8(uint4 w, const float* x) {
    return bf_lo(w.x) * x[0] + bf_hi(w.x) * x[1] + bf_lo(w.y) * x[2] + bf_hi(w.y) * x[3] + bf_lo(w.z) * x[4] +
           bf_hi(w.z) * x[5] + bf_lo(w.w) * x[6] + bf_hi(w.w) * x[7];
}
__device__ float consumers_sum(float v, float* red) {  // every consumer thread's v, summed, to all
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    consumers_sync();
    float t = 0.f;
    for (int k = 0; k < CW; ++k) t += red[k];
    consumers_sync();  // (red is reused)
    return t;
}

// A GEMV stage's input slice of this lane (vectors v0 + lane + 32 j < v1), as the stage's role has it.
__device__ __forceinline__ void gemv_input(float (*x)[8], int role, int t, const unsigned short* in, int v0, int v1,
                                           int lane, unsigned short* resid, const unsigned short* wa,
                                           const unsigned short* wo, float eps, int hidden, int inter, float* red) {
    const uint4* xv = (const uint4*)in;
    const uint4* up = xv + (role == SWIGLU ? inter / 8 : 0);
    uint4 raw[MAXV], raw_up[MAXV];
#pragma unroll
    for (int j = 0; j < MAXV; ++j) {  // (all loads issued before any is used: one L2 round trip)
        const int v = v0 + lane + 32 * j;
        raw[j] = v < v1 ? __ldcg(xv + v) : make_uint4(0, 0, 0, 0);
        raw_up[j] = v < v1 && role == SWIGLU ? __ldcg(up + v) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < MAXV; ++j) unpack8(raw[j], x[j]);
    if (role == SWIGLU) {  // rounded as rlt/kernels/gemv.py's SwiGLU epilogue
#pragma unroll
        for (int j = 0; j < MAXV; ++j) {
            float u[8];
            unpack8(raw_up[j], u);
#pragma unroll
            for (int e = 0; e < 8; ++e) x[j][e] = round_bf16(round_bf16(x[j][e] / (1.f + __expf(-x[j][e]))) * u[e]);
        }
    } else if (role == ADD_NORM) {  // every block computes them; block 0 keeps r' (resid's other half)
        const uint4 *r_in = (const uint4*)(resid + (t % 2) * hidden), *wav = (const uint4*)wa,
                    *wov = (const uint4*)wo;
        uint4* r_out = (uint4*)(resid + ((t + 1) % 2) * hidden);
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < MAXV; ++j)
#pragma unroll
            for (int e = 0; e < 8; ++e) ss += x[j][e] * x[j][e];
        const float ra = rsqrtf(consumers_sum(ss, red) / hidden + eps);
        ss = 0.f;
#pragma unroll
        for (int j = 0; j < MAXV; ++j) {
            const int v = v0 + lane + 32 * j;
            if (v >= v1) continue;
            float r[8], w_a[8];
            unpack8(__ldcg(r_in + v), r);
            unpack8(wav[v], w_a);
            unsigned packed[4] = {0, 0, 0, 0};
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                x[j][e] = round_bf16(r[e] + round_bf16(w_a[e] * round_bf16(x[j][e] * ra)));  // (r')
                ss += x[j][e] * x[j][e];
                packed[e / 2] |= (unsigned)to_bf16(x[j][e]) << (16 * (e % 2));
            }
            if (blockIdx.x == 0) r_out[v] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
        }
        const float rr = rsqrtf(consumers_sum(ss, red) / hidden + eps);
#pragma unroll
        for (int j = 0; j < MAXV; ++j) {
            const int v = v0 + lane + 32 * j;
            if (v >= v1) continue;
            float w_o[8];
            unpack8(wov[v], w_o);
#pragma unroll
            for (int e = 0; e < 8; ++e) x[j][e] = round_bf16(w_o[e] * round_bf16(x[j][e] * rr));
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    chain(const unsigned long long* __restrict__ src,  // [P] GEMV: W (bf16 [N, K]); ATTN: the layer's K/V cache
          const int* __restrict__ kind, const int* __restrict__ role, const int* __restrict__ norm_t,
          const int* __restrict__ n_of,    // GEMV: N; ATTN, MERGE: heads
          const int* __restrict__ k_of,    // GEMV: K; ATTN: cached keys a head (ctx); MERGE: slices a head
          const int* __restrict__ rows_of, // GEMV: rows a chunk; ATTN: keys an item; MERGE: 1
          const int* __restrict__ first_chunk,  // [P + 1] the chain's chunk numbers where each stage starts
          const long long* __restrict__ in_off, const long long* __restrict__ out_off,  // into act (elements)
          unsigned short* act, float* fpart,  // bf16 activations; attention partials [H][S][D + 2]
          int* done,                          // [P] chunks of each stage finished (zero before the launch)
          int P, int wait_for_inputs,         // 0: the byte stream alone (results wrong)
          unsigned short* resid,              // [2][hidden]: the residual, read from one half, written to the other
          const unsigned short* __restrict__ wa, const unsigned short* __restrict__ wo, double eps, int hidden,
          int inter, const float* __restrict__ inv_freq, int pos) {  // RoPE's [D / 2] frequencies; the new key's
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* ring = smem;
    float* part = (float*)(smem + STAGES * STAGE_BYTES);  // [2][64][CW] GEMV partial sums
    float* red = part + 2 * 64 * CW;                      // [32] a sum's per-warp terms
    float* qs = red + 32;                                 // [Q_MAX] an attention stage's q
    float* sc = qs + Q_MAX;                               // [R_MAX] an item's scores
    float* pv = sc + R_MAX;                               // [CW * 32] an item's P @ V partial sums
    unsigned long long* full = (unsigned long long*)(pv + CW * 32);  // the slot's bytes landed
    unsigned long long* empty = full + STAGES;                       // the consumers are done with it
    const int G = gridDim.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int total = first_chunk[P];
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp == CW) {  // the producer: one lane streams this block's chunks, in order
        if (lane == 0) {
            int p = 0;
            for (int c = blockIdx.x, i = 0; c < total; c += G, ++i) {
                while (c >= first_chunk[p + 1]) ++p;
                const int s = i % STAGES, R = rows_of[p], j = c - first_chunk[p];
                mbar_wait(&empty[s], ((i / STAGES) & 1) ^ 1);  // (the first pass finds every slot free)
                const char* base = (const char*)src[p];
                if (kind[p] == GEMV) {
                    const int K = k_of[p], rows = min(R, n_of[p] - j * R);
                    mbar_expect_tx(&full[s], rows * K * 2);
                    bulk_load(ring + s * STAGE_BYTES, base + (size_t)j * R * K * 2, rows * K * 2, &full[s]);
                } else if (kind[p] == ATTN) {  // keys [sl R, sl R + R) of head h: its K tile, then its V tile
                    const int H = n_of[p], ctx = k_of[p], S = ctx / R, h = j / S, sl = j % S;
                    const size_t at = ((size_t)h * ctx + (size_t)sl * R) * D * 2, plane = (size_t)H * ctx * D * 2;
                    mbar_expect_tx(&full[s], 2 * R * D * 2);
                    bulk_load(ring + s * STAGE_BYTES, base + at, R * D * 2, &full[s]);
                    bulk_load(ring + s * STAGE_BYTES + R * D * 2, base + plane + at, R * D * 2, &full[s]);
                } else {
                    mbar_expect_tx(&full[s], 0);  // (a merge streams nothing)
                }
            }
        }
        return;
    }

    float x[MAXV][8];  // a GEMV stage's input slice: warp w takes vectors [v0, v1) of every row
    int p = 0, current = -1, v0 = 0, v1 = 0, mine = 0;  // mine: the block's chunks of p done
    const float scale = rsqrtf((float)D);
    for (int c = blockIdx.x, i = 0; c < total; c += G, ++i) {
        while (c >= first_chunk[p + 1]) ++p;
        const int s = i % STAGES, R = rows_of[p], j = c - first_chunk[p], kd = kind[p];
        if (p != current) {
            if (threadIdx.x == 0 && p > 0 && wait_for_inputs) {
                const int need = first_chunk[p] - first_chunk[p - 1];
                while (load_acquire(&done[p - 1]) < need) {
                }
                __threadfence();
            }
            consumers_sync();
            if (kd == GEMV) {
                const int V = k_of[p] / 8;
                v0 = warp * V / CW, v1 = (warp + 1) * V / CW;
                gemv_input(x, role[p], norm_t[p], act + in_off[p], v0, v1, lane, resid, wa, wo, (float)eps, hidden,
                           inter, red);
            } else if (kd == ATTN) {  // q, rotated
                const uint4* qv = (const uint4*)(act + in_off[p]);
                for (int v = threadIdx.x; v < n_of[p] * D / 8; v += CW * 32) unpack8(__ldcg(qv + v), qs + 8 * v);
                consumers_sync();
                for (int e = threadIdx.x; e < n_of[p] * D / 2; e += CW * 32) {
                    float* at = qs + (e / (D / 2)) * D + e % (D / 2);
                    float sn, cs;
                    sincosf(pos * inv_freq[e % (D / 2)], &sn, &cs);
                    const float a = at[0], b = at[D / 2];
                    at[0] = round_bf16(a * cs - b * sn), at[D / 2] = round_bf16(b * cs + a * sn);
                }
                consumers_sync();
            }
            current = p, mine = 0;
        }
        mbar_wait(&full[s], (i / STAGES) & 1);
        const unsigned char* slot = ring + s * STAGE_BYTES;
        if (kd == GEMV) {
            const int K = k_of[p], V = K / 8, row0 = j * R, rows = min(R, n_of[p] - row0);
            const uint4* w = (const uint4*)slot;
            float* pt = part + (i & 1) * 64 * CW;  // (two in turn: a chunk's sums need no barrier after them)
            for (int r = 0; r < rows; ++r) {
                float acc = 0.f;
#pragma unroll
                for (int jj = 0; jj < MAXV; ++jj) {
                    const int v = v0 + lane + 32 * jj;
                    if (v < v1) acc += dot8(w[r * V + v], x[jj]);
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
                if (lane == 0) pt[r * CW + warp] = acc;
            }
            consumers_sync();
            if (threadIdx.x == 0) mbar_arrive(&empty[s]);  // (the slot is read: the producer may refill it)
            if (threadIdx.x < rows) {
                float y = 0.f;
                for (int k = 0; k < CW; ++k) y += pt[threadIdx.x * CW + k];
                act[out_off[p] + row0 + threadIdx.x] = to_bf16(y);
            }
        } else if (kd == ATTN) {
            const int ctx = k_of[p], S = ctx / R, h = j / S, sl = j % S;
            unsigned short *ks = (unsigned short*)slot, *vs = ks + R * D;
            if (sl == pos / R) {  // the new key: rotated k and v from q/k/v into the slot and the cache
                const int H = n_of[p], row = pos - sl * R, e = threadIdx.x % (D / 2), is_v = threadIdx.x >= D / 2;
                const unsigned short* kv_new = act + in_off[p] + (size_t)(H + is_v * H) * D + h * D;
                unsigned short* cache = (unsigned short*)src[p] + ((size_t)(is_v * H + h) * ctx + pos) * D;
                unsigned short* dst = (is_v ? vs : ks) + row * D;
                if (threadIdx.x < D) {
                    float a = bf(__ldcg(kv_new + e)), b = bf(__ldcg(kv_new + e + D / 2));
                    if (!is_v) {
                        float sn, cs;
                        sincosf(pos * inv_freq[e], &sn, &cs);
                        const float ra = round_bf16(a * cs - b * sn), rb = round_bf16(b * cs + a * sn);
                        a = ra, b = rb;
                    }
                    dst[e] = cache[e] = to_bf16(a), dst[e + D / 2] = cache[e + D / 2] = to_bf16(b);
                    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // (bulk copies refill the slot)
                }
                consumers_sync();
            }
            const float* q = qs + h * D + lane * 4;
            for (int k = warp; k < R; k += CW) {  // scores: a warp a key, a lane four dimensions
                const uint2 kk = *(const uint2*)(ks + k * D + lane * 4);
                float dot = bf_lo(kk.x) * q[0] + bf_hi(kk.x) * q[1] + bf_lo(kk.y) * q[2] + bf_hi(kk.y) * q[3];
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                if (lane == 0) sc[k] = dot * scale;
            }
            consumers_sync();
            float m = NEG_INF, l = 0.f;
            for (int k = 0; k < R; ++k) m = fmaxf(m, sc[k]);
            for (int k = 0; k < R; ++k) l += __expf(sc[k] - m);
            const int d = threadIdx.x % D, g = threadIdx.x / D, groups = CW * 32 / D;
            float acc = 0.f;
            for (int k = g; k < R; k += groups) acc += __expf(sc[k] - m) * bf(vs[k * D + d]);
            pv[g * D + d] = acc;
            consumers_sync();
            if (threadIdx.x == 0) mbar_arrive(&empty[s]);
            if (threadIdx.x < D) {
                float o = 0.f;
                for (int k = 0; k < groups; ++k) o += pv[k * D + threadIdx.x];
                float* out = fpart + ((size_t)h * S + sl) * (D + 2);
                out[threadIdx.x] = o;
                if (threadIdx.x == 0) out[D] = m, out[D + 1] = l;
            }
        } else {  // MERGE: head j's slices (its slot holds nothing)
            consumers_sync();  // (every consumer past this slot's wait before it is freed: a waiter that fell two
            if (threadIdx.x == 0) mbar_arrive(&empty[s]);  //  phases behind would wait on the wrong one)
            const int S = k_of[p];
            const float* in = fpart + (size_t)j * S * (D + 2);
            float m = NEG_INF, l = 0.f, o = 0.f;
            for (int k = 0; k < S; ++k) m = fmaxf(m, __ldcg(in + k * (D + 2) + D));
            for (int k = 0; k < S; ++k) {
                const float w = __expf(__ldcg(in + k * (D + 2) + D) - m);
                l += w * __ldcg(in + k * (D + 2) + D + 1);
                if (threadIdx.x < D) o += w * __ldcg(in + k * (D + 2) + threadIdx.x);
            }
            if (threadIdx.x < D) act[out_off[p] + j * D + threadIdx.x] = to_bf16(o / l);
        }
        ++mine;
        if (c + G >= first_chunk[p + 1]) {  // the block's last chunk of p: counted at once
            consumers_sync();
            if (threadIdx.x == 0) {
                __threadfence();  // (after the barrier: every consumer's stores, then the count)
                atomicAdd(&done[p], mine);
            }
        }
    }
}
