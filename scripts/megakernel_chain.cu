// One persistent launch for a chain of one-row products (#36's loop-step kernel, products only):
// stage p computes buf[p + 1][:N_p] = W_p @ buf[p][:K_p] in bf16 with float32 sums. Weights never
// depend on the chain, so each block's producer warp streams its share of every product's rows
// into a shared-memory ring (1-D bulk copies, mbarriers) without waiting for anything but a free
// slot; its consumer warps wait on the previous product's completion counter only when they start
// a product, then multiply the rows already on chip. The weight stream runs ahead of the dependency
// chain by up to the ring's depth: the chain's waits overlap the loads instead of following them.
//
// Work: the products' rows cut into chunks (ROWS[p] rows, at most STAGE_BYTES), numbered through
// the whole chain in order; block b takes chunks b, b + G, ... (so every block meets the products
// in order: no block waits on work queued behind its own). A block adds its count of p's chunks to
// done[p] once, after its last one (one fence a product, not one a chunk). All blocks must be
// resident at once (grid <= SMs, one block an SM).
//
// Built by scripts/bench_megakernel.py with torch.cuda._compile_kernel (NVRTC), STAGES,
// STAGE_BYTES and CW (consumer warps) substituted as macros.

#define THREADS ((CW + 1) * 32)
#define MAXV 4  // 16-byte vectors of x per lane: K <= MAXV * 8 * 32 * CW

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}
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
__device__ __forceinline__ unsigned short to_bf16(float f) {  // round to nearest even (finite values)
    unsigned u = __float_as_uint(f);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ void unpack8(uint4 v, float* out) {
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        out[2 * e] = bf_lo(u[e]);
        out[2 * e + 1] = bf_hi(u[e]);
    }
}
__device__ __forceinline__ float round_bf16(float f) { return __uint_as_float(((unsigned)to_bf16(f)) << 16); }
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
__device__ __forceinline__ float dot8(uint4 w, const float* x) {
    return bf_lo(w.x) * x[0] + bf_hi(w.x) * x[1] + bf_lo(w.y) * x[2] + bf_hi(w.y) * x[3] + bf_lo(w.z) * x[4] +
           bf_hi(w.z) * x[5] + bf_lo(w.w) * x[6] + bf_hi(w.w) * x[7];
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    chain(const unsigned long long* __restrict__ weights,  // [P] addresses of W_p, bf16 [N_p, K_p] row-major
          const int* __restrict__ n_of, const int* __restrict__ k_of,
          const int* __restrict__ rows_of,      // [P] rows a chunk of product p holds
          const int* __restrict__ first_chunk,  // [P + 1] the chain's chunk numbers where each product starts
          unsigned short* buf, int stride,      // buf[p] at buf + p * stride (bf16)
          int* done,                            // [P] chunks of each product finished (zero before the launch)
          int P, int wait_for_inputs,           // wait_for_inputs 0: the weight stream alone (wrong sums)
          int layer_ops,  // 1: products in fours (q/k/v, o, [gate; up], down) with the engine's add + RMSNorm
                          // (Ouro's, sandwich) before [gate; up] and the next q/k/v, SwiGLU before down
          unsigned short* resid,  // [2][hidden]: the residual, read from one half, written (block 0) to the other
          const unsigned short* __restrict__ wa, const unsigned short* __restrict__ wo, double eps, int hidden,
          int inter) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* ring = smem;
    float* part = (float*)(smem + STAGES * STAGE_BYTES);  // [2][rows][CW] partial sums
    float* red = part + 2 * 64 * CW;                      // [32] a sum's per-warp terms
    unsigned long long* full = (unsigned long long*)(red + 32);  // the slot's bytes landed
    unsigned long long* empty = full + STAGES;                         // the consumers are done with it
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
                const int s = i % STAGES, R = rows_of[p], K = k_of[p];
                const int row0 = (c - first_chunk[p]) * R, rows = min(R, n_of[p] - row0);
                mbar_wait(&empty[s], ((i / STAGES) & 1) ^ 1);  // (the first pass finds every slot free)
                mbar_expect_tx(&full[s], rows * K * 2);
                bulk_load(ring + s * STAGE_BYTES, (const char*)weights[p] + (size_t)row0 * K * 2, rows * K * 2,
                          &full[s]);
            }
        }
        return;
    }

    // The consumers: warp w sums its slice of every row of a chunk against its slice of x, which
    // its lanes hold in registers for as long as the block stays on the product.
    float x[MAXV][8];
    int p = 0, current = -1, v0 = 0, v1 = 0, mine = 0;  // mine: the block's chunks of p done
    for (int c = blockIdx.x, i = 0; c < total; c += G, ++i) {
        while (c >= first_chunk[p + 1]) ++p;
        const int s = i % STAGES, R = rows_of[p], K = k_of[p], V = K / 8;
        const int row0 = (c - first_chunk[p]) * R, rows = min(R, n_of[p] - row0);
        if (p != current) {
            if (threadIdx.x == 0 && p > 0 && wait_for_inputs) {
                const int need = first_chunk[p] - first_chunk[p - 1];
                while (load_acquire(&done[p - 1]) < need) {
                }
                __threadfence();
            }
            consumers_sync();
            v0 = warp * V / CW, v1 = (warp + 1) * V / CW;
            const int role = layer_ops ? p % 4 : 1;  // (0 q/k/v, 1 o or a plain product, 2 [gate; up], 3 down)
            const uint4* xv = (const uint4*)(buf + (size_t)p * stride);
            const uint4* up = xv + (role == 3 ? inter / 8 : 0);  // (SwiGLU: [gate; up], gate first)
            uint4 raw[MAXV], raw_up[MAXV];
#pragma unroll
            for (int j = 0; j < MAXV; ++j) {  // (all loads issued before any is used: one L2 round trip)
                const int v = v0 + lane + 32 * j;
                raw[j] = v < v1 ? __ldcg(xv + v) : make_uint4(0, 0, 0, 0);
                raw_up[j] = v < v1 && role == 3 ? __ldcg(up + v) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int j = 0; j < MAXV; ++j) unpack8(raw[j], x[j]);
            if (role == 3) {  // silu(gate) * up, rounded as rlt/kernels/gemv.py's SwiGLU epilogue
#pragma unroll
                for (int j = 0; j < MAXV; ++j) {
                    float u[8];
                    unpack8(raw_up[j], u);
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        const float g = x[j][e];
                        x[j][e] = round_bf16(round_bf16(g / (1.f + __expf(-g))) * u[e]);
                    }
                }
            } else if (role == 2 || (role == 0 && p > 0)) {
                // x: the last product's output a; the residual r' = r + rms_norm(a, wa), the input
                // rms_norm(r', wo), rounded as rlt/kernels/norm.py's add + RMSNorm. Every block
                // computes them; block 0 keeps r' for the next one (the other half of resid).
                const int t = 2 * (p / 4) - (role == 0);  // (the chain's norms in order)
                const uint4 *r_in = (const uint4*)(resid + (t % 2) * hidden), *wav = (const uint4*)wa,
                            *wov = (const uint4*)wo;
                uint4* r_out = (uint4*)(resid + ((t + 1) % 2) * hidden);
                float ss = 0.f;
#pragma unroll
                for (int j = 0; j < MAXV; ++j)
#pragma unroll
                    for (int e = 0; e < 8; ++e) ss += x[j][e] * x[j][e];
                const float ra = rsqrtf(consumers_sum(ss, red) / hidden + (float)eps);
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
                        const float an = round_bf16(w_a[e] * round_bf16(x[j][e] * ra));
                        x[j][e] = round_bf16(r[e] + an);  // (x now holds r')
                        ss += x[j][e] * x[j][e];
                        packed[e / 2] |= (unsigned)to_bf16(x[j][e]) << (16 * (e % 2));
                    }
                    if (blockIdx.x == 0) r_out[v] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
                }
                const float rr = rsqrtf(consumers_sum(ss, red) / hidden + (float)eps);
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
            current = p, mine = 0;
        }
        mbar_wait(&full[s], (i / STAGES) & 1);
        const uint4* w = (const uint4*)(ring + s * STAGE_BYTES);
        float* pt = part + (i & 1) * 64 * CW;  // (two in turn: a chunk's sums need no barrier after them)
        for (int r = 0; r < rows; ++r) {
            float acc = 0.f;
#pragma unroll
            for (int j = 0; j < MAXV; ++j) {
                const int v = v0 + lane + 32 * j;
                if (v < v1) acc += dot8(w[r * V + v], x[j]);
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
            buf[(size_t)(p + 1) * stride + row0 + threadIdx.x] = to_bf16(y);
        }
        ++mine;
        if (c + G >= first_chunk[p + 1]) {  // the block's last chunk of p: its rows of p are counted at once
            consumers_sync();
            if (threadIdx.x == 0) {
                __threadfence();  // (after the barrier: every consumer's stores, then the count)
                atomicAdd(&done[p], mine);
            }
        }
    }
}
