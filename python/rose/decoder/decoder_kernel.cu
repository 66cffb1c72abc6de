// A query of at most 16 tokens from its ids to its pooled vectors in one persistent launch of GRID
// blocks (one an SM): the embedding's rows, Qwen3's decoder layers, the final RMSNorm and the
// pooling. Compiled at run time by NVRTC (rose.runtime.nvrtc) with the model's sizes as macros:
//   HID, INTER, HQ, HK, D, NLAYERS, CAUSAL, GRID, STAGES, FP16 (0: bfloat16), and SQUARES (where
//   the rows' sums of squares lie in `bar`, away from the barrier's counter).
// rose.decoder.cuda_build.fits() says which sizes it takes (Qwen3-0.6B's, with GRID = HID / 8 = 128).
// One launch for the whole query, because in a CUDA graph the small kernels around the layers
// (gathering the embeddings, positions and sequence ids, the final norm, the pooling) cost a node
// and a dependency each.
//
// A 16-token query is bound by reading the weights (881 MB for Qwen3-0.6B) and by the chain of
// phases, four a layer, that meet at grid-wide barriers. So the
// blocks are warp-specialized: warp 8 (the producer) streams the block's weight chunks for every
// layer, in the order they are used, through a ring of STAGES 16 KB shared-memory slots with TMA
// bulk copies (cp.async.bulk; an mbarrier a slot counts the bytes in), so the weights of the next
// phase travel while warps 0-7 (the consumers) compute this one.
//
// The producer issues a phase's chunks only once the consumers have started the phase before it
// (`started`). Streaming as soon as slots were free put the bulk copies in front of the barriers'
// and activations' small reads in the memory system, and the barriers took twice as long.
//
// What block b computes each phase (its weight chunks: 8 rows x HID, or O_ROWS rows x D for O):
//   QKV      columns [b*QC, (b+1)*QC) of q, k, v; the input RMSNorm folded in as
//            rstd * ((x * g) @ W), x * g read in 16 bits (xg) and the rows' squares (squares) as
//            the down phase before left them (layer 0: from the embedding's rows, and the block
//            writes x's columns [b*8, b*8 + 8) from them)
//   attn+O   head b / O_BLOCKS (QK-norm, RoPE, softmax over the block-diagonal mask) times O's
//            output columns [(b % O_BLOCKS) * ORB, +ORB), added into x by atomics (the heads share
//            x's columns)
//   gate-up  GC intermediate columns: for each 8, a chunk of gate rows and one of up rows, then
//            SiLU(gate) * up
//   down     x's columns [b*8, b*8 + 8) over all of INTER, added to x; the block, owning them,
//            stores them times the next layer's input-norm weights in 16 bits into xg and adds
//            their squares to the rows' sums (half the bytes of x for every block to read next)
//   tail     (after the last down phase) the final norm of those 8 columns, pooled per sequence
// The products are mma.sync m16n8k16 (16 tokens fill its M). Their A operand stays in registers:
// warp w takes the slice [w*HID/8, (w+1)*HID/8) of the inner dimension, and the warps' partial sums
// (and the RMSNorm's squares) are added up in shared memory. Each thread reads 8 consecutive k of a
// row (one 16-byte load) for A and B alike, an order of k that the dot product does not mind.
// Values are rounded to 16 bits where the layer-by-layer path stores 16-bit tensors.

typedef unsigned short u16;
typedef unsigned int u32;

#define ROWS 16
#define WARPS 8
#define CONSUMERS (WARPS * 32)
#define THREADS (CONSUMERS + 32)
#define SLOT 16384
#define QD (HQ * D)
#define NQKV ((HQ + 2 * HK) * D)
#define STEPS (HID / 256)  // k-steps of 32 a warp's slice takes
#define QC (NQKV / GRID)
#define QKV_CHUNKS (QC / 8)
#define O_BLOCKS (GRID / HQ)
#define ORB (HID / O_BLOCKS)
#define O_ROWS (SLOT / 2 / D)
#define O_CHUNKS (ORB / O_ROWS)
#define GC (INTER / GRID)
#define GU_CHUNKS (2 * GC / 8)
#define DOWN_CHUNKS (INTER / HID)
#define PER_LAYER (QKV_CHUNKS + O_CHUNKS + GU_CHUNKS + DOWN_CHUNKS)
#define MAX_CHUNKS (QKV_CHUNKS > GU_CHUNKS ? QKV_CHUNKS : GU_CHUNKS)

#if FP16
#define MMA_TYPE "f16"
#else
#define MMA_TYPE "bf16"
#endif

__device__ __forceinline__ float to_f32(u16 h) {
#if FP16
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    return __uint_as_float(((u32)h) << 16);
#endif
}

__device__ __forceinline__ u16 to_16(float f) {
    u16 h;
#if FP16
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
#else
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
#endif
    return h;
}

__device__ __forceinline__ float round16(float f) { return to_f32(to_16(f)); }

__device__ __forceinline__ u32 pack(float lo, float hi) { return (u32)to_16(lo) | ((u32)to_16(hi) << 16); }

__device__ __forceinline__ uint4 load_cg4(const void* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ float4 load_cg4f(const float* p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ float load_cgf(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

// c += A B for one m16n8k16 product, fragments as the PTX manual lays them out.
__device__ __forceinline__ void mma_raw(float c[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32." MMA_TYPE "." MMA_TYPE ".f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma(float c[4], uint4 a_lo, uint4 a_hi, uint4 b, bool second) {
    u32 a0 = second ? a_lo.z : a_lo.x, a1 = second ? a_hi.z : a_hi.x;
    u32 a2 = second ? a_lo.w : a_lo.y, a3 = second ? a_hi.w : a_hi.y;
    u32 b0 = second ? b.z : b.x, b1 = second ? b.w : b.y;
    mma_raw(c, a0, a1, a2, a3, b0, b1);
}

// The consumers' own barrier (the producer warp never joins it).
__device__ __forceinline__ void cbar() { asm volatile("bar.sync 1, %0;" ::"n"(CONSUMERS) : "memory"); }

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(unsigned long long* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_wait(unsigned long long* bar, u32 parity) {
    u32 done;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(smem_addr(bar)), "r"(parity)
            : "memory");
    } while (!done);
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_expect(unsigned long long* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, u32 bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}

// x[0..3] += a, b, c, d in one 16-byte atomic (which returns nothing).
__device__ __forceinline__ void red_add4(float* p, float a, float b, float c, float d) {
    asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d)
                 : "memory");
}

// The last phase (layer * 4 + 0 QKV, 1 attention and O, 2 gate-up, 3 down) the consumers started.
__shared__ int started;

__device__ __forceinline__ void mark_started(int phase) {
    if (threadIdx.x == 0) *(volatile int*)&started = phase;
}

struct Weights {
    const u16 *qkv, *o, *gu, *down;
};

// The producer: every chunk of the block, in the order the consumers take them.
__device__ void produce(const Weights& w, unsigned char* slots, unsigned long long* full, unsigned long long* empty) {
    int lane = threadIdx.x & 31, b = blockIdx.x;
    for (int j = 0; j < PER_LAYER * NLAYERS; j++) {
        int slot = j % STAGES, fill = j / STAGES;
        if (fill > 0) mbar_wait(empty + slot, (fill - 1) & 1);
        int layer = j / PER_LAYER, r = j % PER_LAYER;
        int phase = layer * 4 + (r < QKV_CHUNKS ? 0 : r < QKV_CHUNKS + O_CHUNKS ? 1 : r < PER_LAYER - DOWN_CHUNKS ? 2 : 3);
        while (*(volatile int*)&started < phase - 1) {
        }
        if (lane == 0) mbar_expect(full + slot, SLOT);
        __syncwarp();
        unsigned char* dst = slots + slot * SLOT;
        if (r < QKV_CHUNKS) {
            if (lane == 0) bulk_copy(dst, w.qkv + (long)layer * NQKV * HID + (long)(b * QC + r * 8) * HID, SLOT, full + slot);
        } else if ((r -= QKV_CHUNKS) < O_CHUNKS) {
            int head = b / O_BLOCKS, row0 = (b % O_BLOCKS) * ORB + r * O_ROWS;
            const u16* src = w.o + (long)layer * HID * QD + (long)row0 * QD + head * D;
            for (int row = lane; row < O_ROWS; row += 32) bulk_copy(dst + row * D * 2, src + (long)row * QD, D * 2, full + slot);
        } else if ((r -= O_CHUNKS) < GU_CHUNKS) {
            int row0 = (r % 2) * INTER + b * GC + (r / 2) * 8;
            if (lane == 0) bulk_copy(dst, w.gu + (long)layer * 2 * INTER * HID + (long)row0 * HID, SLOT, full + slot);
        } else {
            r -= GU_CHUNKS;
            const u16* src = w.down + (long)layer * HID * INTER + (long)(b * 8) * INTER + r * HID;
            if (lane < 8) bulk_copy(dst + lane * HID * 2, src + (long)lane * INTER, HID * 2, full + slot);
        }
    }
}

// The consumers' side of the ring.
struct Ring {
    unsigned char* slots;
    unsigned long long *full, *empty;
    int next;

    // The next chunk, once it has landed.
    __device__ __forceinline__ const unsigned char* acquire() {
        mbar_wait(full + next % STAGES, (next / STAGES) & 1);
        return slots + (next % STAGES) * SLOT;
    }

    // The warp is done reading the chunk.
    __device__ __forceinline__ void release() {
        __syncwarp();
        if ((threadIdx.x & 31) == 0) mbar_arrive(empty + next % STAGES);
        next++;
    }
};

// Every block's consumers meet here; `epoch` counts the launch's barriers from 1. (One flag a
// block, each thread t < GRID waiting for block t's, was slower. Instead of
// the barrier after QKV, waiting for the 12 blocks that make a head's q, k and v, by counters or by
// spinning on words of data and flag, was no faster: their data took as long to arrive.)
__device__ void grid_sync(unsigned* bar, unsigned epoch) {
    cbar();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
        unsigned seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(bar) : "memory");
        } while (seen < epoch * GRID);
    }
    cbar();
}

// A normed GEMM's A operand: x in float32, or (layer 0) the rows of the embedding at ids.
struct NormSource {
    const float* x;
    const int* ids;
    const u16* embed;
};

// 8 values of row `row` from k = unit * 8, in float32.
template <bool EMBEDDED>
__device__ __forceinline__ void load_unit(const NormSource& src, int row, int unit, float out[8]) {
    if (EMBEDDED) {
        uint4 v = *(const uint4*)(src.embed + (long)src.ids[row] * HID + unit * 8);
        u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; k++) out[2 * k] = to_f32(w[k] & 0xffff), out[2 * k + 1] = to_f32(w[k] >> 16);
    } else {
        float4 lo = load_cg4f(src.x + row * HID + unit * 8), hi = load_cg4f(src.x + row * HID + unit * 8 + 4);
        float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int k = 0; k < 8; k++) out[k] = v[k];
    }
}

// The warp's slice of A = x * g (rows past n zero) in the mma's order: lo[s], hi[s] are 8 k of
// rows g and g + 8 at unit (warp * 4 * STEPS + 4 * s + q); the slice's squares of x per row go to
// sq[warp * 16 + row].
template <bool EMBEDDED>
__device__ __forceinline__ void load_normed(const NormSource& src, const u16* gain, uint4 lo[STEPS], uint4 hi[STEPS],
                                            float* sq, int n) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    float a[STEPS][8], c[STEPS][8];
    uint4 gw[STEPS];
#pragma unroll
    for (int s = 0; s < STEPS; s++) {
        int unit = warp * 4 * STEPS + 4 * s + q;
#pragma unroll
        for (int k = 0; k < 8; k++) a[s][k] = c[s][k] = 0.f;
        if (g < n) load_unit<EMBEDDED>(src, g, unit, a[s]);
        if (g + 8 < n) load_unit<EMBEDDED>(src, g + 8, unit, c[s]);
        gw[s] = *(const uint4*)(gain + unit * 8);
    }
    float sq_lo = 0.f, sq_hi = 0.f;
#pragma unroll
    for (int s = 0; s < STEPS; s++) {
        u32 gs[4] = {gw[s].x, gw[s].y, gw[s].z, gw[s].w}, ol[4], oh[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float g0 = to_f32(gs[k] & 0xffff), g1 = to_f32(gs[k] >> 16);
            sq_lo += a[s][2 * k] * a[s][2 * k] + a[s][2 * k + 1] * a[s][2 * k + 1];
            sq_hi += c[s][2 * k] * c[s][2 * k] + c[s][2 * k + 1] * c[s][2 * k + 1];
            ol[k] = pack(a[s][2 * k] * g0, a[s][2 * k + 1] * g1);
            oh[k] = pack(c[s][2 * k] * g0, c[s][2 * k + 1] * g1);
        }
        lo[s] = make_uint4(ol[0], ol[1], ol[2], ol[3]);
        hi[s] = make_uint4(oh[0], oh[1], oh[2], oh[3]);
    }
    sq_lo += __shfl_xor_sync(0xffffffffu, sq_lo, 1);
    sq_lo += __shfl_xor_sync(0xffffffffu, sq_lo, 2);
    sq_hi += __shfl_xor_sync(0xffffffffu, sq_hi, 1);
    sq_hi += __shfl_xor_sync(0xffffffffu, sq_hi, 2);
    if (q == 0) sq[warp * 16 + g] = sq_lo, sq[warp * 16 + g + 8] = sq_hi;
}

// The warp's slice of m[:, k0 : k0 + HID] (16-bit, rows of WIDTH) in the mma's order (rows past n
// zero).
template <int WIDTH>
__device__ __forceinline__ void load_rows(const u16* m, int k0, uint4 lo[STEPS], uint4 hi[STEPS], int n) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int s = 0; s < STEPS; s++) {
        int unit = warp * 4 * STEPS + 4 * s + q;
        lo[s] = g < n ? load_cg4(m + g * WIDTH + k0 + unit * 8) : make_uint4(0, 0, 0, 0);
        hi[s] = g + 8 < n ? load_cg4(m + (g + 8) * WIDTH + k0 + unit * 8) : make_uint4(0, 0, 0, 0);
    }
}

// c += the warp's slice of A times a chunk of 8 weight rows over HID (row-major in the slot).
__device__ __forceinline__ void chunk_product(float c[4], const uint4 lo[STEPS], const uint4 hi[STEPS],
                                              const unsigned char* w) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int s = 0; s < STEPS; s++) {
        int unit = warp * 4 * STEPS + 4 * s + q;
        uint4 b = *(const uint4*)(w + g * HID * 2 + unit * 16);
        mma(c, lo[s], hi[s], b, false);
        mma(d, lo[s], hi[s], b, true);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) c[i] += d[i];
}

// c[k] = the warp's slice of A times the ring's next NCH chunks, which it releases. One chunk at a
// time: waiting for all of them first, to interleave their products, was slower.
template <int NCH>
__device__ __forceinline__ void phase_products(float c[NCH][4], const uint4 lo[STEPS], const uint4 hi[STEPS], Ring& ring) {
#pragma unroll
    for (int k = 0; k < NCH; k++) {
        c[k][0] = c[k][1] = c[k][2] = c[k][3] = 0.f;
        chunk_product(c[k], lo, hi, ring.acquire());
        ring.release();
    }
}

// The warp's slice of A times the ring's next NCH chunks, its partial products to red[k][warp].
template <int NCH>
__device__ __forceinline__ void partial_products(const uint4 lo[STEPS], const uint4 hi[STEPS], float* red, Ring& ring) {
    float c[NCH][4];
    phase_products<NCH>(c, lo, hi, ring);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < NCH; k++)
        *(float4*)(red + (k * WARPS + warp) * 128 + lane * 4) = make_float4(c[k][0], c[k][1], c[k][2], c[k][3]);
}

// RMSNorm(x) (rows past n zero) times the ring's next NCH chunks, before the norm's rstd: each
// warp's partial products go to red[k][warp], the squares of its slice of x to sq.
template <int NCH, bool EMBEDDED>
__device__ __forceinline__ void normed_products(const NormSource& src, const u16* gain, float* red, float* sq,
                                                Ring& ring, int n) {
    uint4 lo[STEPS], hi[STEPS];
    load_normed<EMBEDDED>(src, gain, lo, hi, sq, n);
    partial_products<NCH>(lo, hi, red, ring);
}

// Element e < 128 of a warp's [16, 8] product: its row and column.
__device__ __forceinline__ int element_row(int e) { return (e >> 4) + 8 * ((e >> 1) & 1); }
__device__ __forceinline__ int element_col(int e) { return 2 * ((e >> 2) & 3) + (e & 1); }

// The sum over warps of element e of chunk `chunk`'s partial products.
__device__ __forceinline__ float reduce(const float* red, int chunk, int e) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; w++) sum += red[(chunk * WARPS + w) * 128 + e];
    return sum;
}

__device__ __forceinline__ float rstd_of(const float* sq, int row, float eps) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; w++) sum += sq[w * 16 + row];
    return rsqrtf(sum / HID + eps);
}

// A row of `units` 16-byte units in shared memory, odd rows' units swapped in fours (no conflicts).
__device__ __forceinline__ int unit_at(int row, int unit, int units) {
    return (row * units + (unit ^ ((row & 1) << 2))) * 16;
}

__device__ __forceinline__ uint4 lds4(const unsigned char* base, int row, int unit, int units) {
    return *(const uint4*)(base + unit_at(row, unit, units));
}

#define PER (D / 64)            // rotation pairs (k, k + D / 2) a lane takes, k = lane + 32 i
#define VSTRIDE (D * 2 + 16)    // bytes of a row of v: ldmatrix's 8 rows fall on distinct banks
#define QK_LOADS (ROWS * 2 * D / 8 / CONSUMERS)  // 16-byte loads a thread of a head's q and k rows
static_assert(ROWS * 2 * D / 8 % CONSUMERS == 0, "the consumers share q's and k's 16-byte units evenly");

// What a thread's part of the attention needs from outside the layer, loaded once a launch: the
// rotation of its rows (warp, warp + 8) and the mask of its scores (rows g, g + 8; keys 2q,
// 2q + 1, 8 + 2q, 9 + 2q), bit 4 * r + k.
struct AttnConsts {
    float cos[2][PER], sin[2][PER];
    unsigned mask;
};

// Token t's sequence (searchsorted(cu[1:], t, right=True)) and position in it, for t < ROWS:
// derived here from the offsets, so that nothing but ids and offsets is uploaded for a batch.
__shared__ int token_seq[ROWS], token_pos[ROWS];

__device__ __forceinline__ void locate_tokens(const int* cu, int sequences) {
    int t = threadIdx.x;
    if (t < ROWS) {
        int s = 0;
        for (int i = 1; i <= sequences; i++) s += cu[i] <= t;
        token_seq[t] = s, token_pos[t] = t - cu[min(s, sequences)];
    }
}

__device__ AttnConsts attn_consts(const float* rope, int n) {
    AttnConsts c;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = warp + 8 * r, position = row < n ? token_pos[row] : 0;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            c.cos[r][i] = rope[position * D + lane + 32 * i];
            c.sin[r][i] = rope[position * D + D / 2 + lane + 32 * i];
        }
    }
    c.mask = 0;
    int keys[4] = {2 * q, 2 * q + 1, 8 + 2 * q, 9 + 2 * q};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = g + 8 * r;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int key = keys[k];
            bool seen = row < n && key < n && token_seq[row] == token_seq[key] && (!CAUSAL || key <= row);
            c.mask |= (unsigned)seen << (4 * r + k);
        }
    }
    return c;
}

// A layer's QK-norm weights for the thread's elements (k and k + D / 2, k = lane + 32 i).
struct NormWeights {
    u16 q[2 * PER], k[2 * PER];
};

__device__ __forceinline__ NormWeights norm_weights(const u16* q_norm, const u16* k_norm) {
    NormWeights w;
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        w.q[i] = q_norm[lane + 32 * i], w.q[PER + i] = q_norm[D / 2 + lane + 32 * i];
        w.k[i] = k_norm[lane + 32 * i], w.k[PER + i] = k_norm[D / 2 + lane + 32 * i];
    }
    return w;
}

__device__ __forceinline__ void st16(unsigned char* base, int row, int k, u16 v) {
    *(u16*)(base + unit_at(row, k >> 3, D / 8) + (k & 7) * 2) = v;
}

// One head's attention output [16, D] as O's A operand in `a`, as the layer-by-layer path
// computes it (q, k normed and rotated and rounded to 16 bits; the probabilities too). q and k go
// to qs, ks and v to vs in 16 bits; then every warp computes the [16, 16] scores and softmax with
// tensor-core products, and its D / 8 columns of P V.
__device__ void attend(const u16* qkv, int head, const NormWeights& nw, const AttnConsts& ac, unsigned char* loaded,
                       unsigned char* qs, unsigned char* ks, unsigned char* vs, unsigned char* a, int n, float eps,
                       float scale) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x, g = lane >> 2, q = lane & 3;
    int kv_head = head / (HQ / HK);
    // q and k go through shared memory (`loaded`, [16, 2 D]) in 16-byte loads: reading each thread's
    // elements straight from global memory would take 16 2-byte loads a thread.
    uint4 part[QK_LOADS];
#pragma unroll
    for (int j = 0; j < QK_LOADS; j++) {
        int i = tid + CONSUMERS * j, row = i / (2 * D / 8), which = (i / (D / 8)) % 2, unit = i % (D / 8);
        part[j] = row < n ? load_cg4(qkv + row * NQKV + (which ? QD + kv_head * D : head * D) + unit * 8)
                          : make_uint4(0, 0, 0, 0);
    }
    int v_row = tid / (D / 8), v_unit = tid % (D / 8);
    uint4 vraw = make_uint4(0, 0, 0, 0);
    if (v_row < ROWS && v_row < n) vraw = load_cg4(qkv + v_row * NQKV + QD + (HK + kv_head) * D + v_unit * 8);
#pragma unroll
    for (int j = 0; j < QK_LOADS; j++) *(uint4*)(loaded + (tid + CONSUMERS * j) * 16) = part[j];
    cbar();
    u16 raw[2][2][2 * PER];  // [q or k][row warp or warp + 8][first halves, second halves]
#pragma unroll
    for (int which = 0; which < 2; which++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const u16* src = (const u16*)loaded + ((warp + 8 * r) * 2 + which) * D + lane;
#pragma unroll
            for (int i = 0; i < PER; i++) raw[which][r][i] = src[32 * i], raw[which][r][PER + i] = src[D / 2 + 32 * i];
        }
#pragma unroll
    for (int which = 0; which < 2; which++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = warp + 8 * r;
            const u16* w = which ? nw.k : nw.q;
            unsigned char* out = which ? ks : qs;
            float squares = 0.f;
#pragma unroll
            for (int i = 0; i < 2 * PER; i++) squares += to_f32(raw[which][r][i]) * to_f32(raw[which][r][i]);
            for (int offset = 16; offset; offset >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
            float norm = rsqrtf(squares / D + eps);
#pragma unroll
            for (int i = 0; i < PER; i++) {
                int k = lane + 32 * i;
                float x1 = round16(to_f32(w[i]) * round16(to_f32(raw[which][r][i]) * norm));
                float x2 = round16(to_f32(w[PER + i]) * round16(to_f32(raw[which][r][PER + i]) * norm));
                float cos = ac.cos[r][i], sin = ac.sin[r][i];
                st16(out, row, k, row < n ? to_16(x1 * cos - x2 * sin) : (u16)0);
                st16(out, row, k + D / 2, row < n ? to_16(x2 * cos + x1 * sin) : (u16)0);
            }
        }
    if (v_row < ROWS) *(uint4*)(vs + v_row * VSTRIDE + v_unit * 16) = vraw;
    cbar();
    // Scores [16, 16]: keys 0-7 in s0, 8-15 in s1 (two chains each).
    float s0[4] = {0.f, 0.f, 0.f, 0.f}, s0b[4] = {0.f, 0.f, 0.f, 0.f};
    float s1[4] = {0.f, 0.f, 0.f, 0.f}, s1b[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int s = 0; s < D / 32; s++) {
        uint4 lo = lds4(qs, g, s * 4 + q, D / 8), hi = lds4(qs, g + 8, s * 4 + q, D / 8);
        uint4 k0 = lds4(ks, g, s * 4 + q, D / 8), k1 = lds4(ks, g + 8, s * 4 + q, D / 8);
        mma(s0, lo, hi, k0, false), mma(s0b, lo, hi, k0, true);
        mma(s1, lo, hi, k1, false), mma(s1b, lo, hi, k1, true);
    }
    // sc[r][k]: row g + 8 r, key (2q, 2q + 1, 8 + 2q, 9 + 2q)[k]
    float sc[2][4] = {{s0[0] + s0b[0], s0[1] + s0b[1], s1[0] + s1b[0], s1[1] + s1b[1]},
                      {s0[2] + s0b[2], s0[3] + s0b[3], s1[2] + s1b[2], s1[3] + s1b[3]}};
    u32 pa[2][2];  // P's A fragment: [row g or g + 8][keys 2q.. or 8 + 2q..]
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float top = -1e30f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            sc[r][k] = (ac.mask >> (4 * r + k)) & 1 ? sc[r][k] * scale : -1e30f;  // finite: padding rows stay finite
            top = fmaxf(top, sc[r][k]);
        }
        top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
        top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
        float total = 0.f;
#pragma unroll
        for (int k = 0; k < 4; k++) total += (sc[r][k] = __expf(sc[r][k] - top));
        total += __shfl_xor_sync(0xffffffffu, total, 1);
        total += __shfl_xor_sync(0xffffffffu, total, 2);
        // One reciprocal, not four IEEE divisions.
        float inv = __frcp_rn(total);
        pa[r][0] = pack(sc[r][0] * inv, sc[r][1] * inv);
        pa[r][1] = pack(sc[r][2] * inv, sc[r][3] * inv);
    }
    // P V for the warp's columns: n-tiles 2 warp and 2 warp + 1 (D / 8 = 16 tiles).
    {
        int mi = lane >> 3, key = (lane & 7) + 8 * (mi & 1), col = 16 * warp + 8 * (mi >> 1);
        u32 b0, b1, b2, b3;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                     : "r"(smem_addr(vs + key * VSTRIDE + col * 2)));
        float o0[4] = {0.f, 0.f, 0.f, 0.f}, o1[4] = {0.f, 0.f, 0.f, 0.f};
        mma_raw(o0, pa[0][0], pa[1][0], pa[0][1], pa[1][1], b0, b1);
        mma_raw(o1, pa[0][0], pa[1][0], pa[0][1], pa[1][1], b2, b3);
        int t0 = 2 * warp, t1 = 2 * warp + 1;
        *(u32*)(a + unit_at(g, t0, D / 8) + 4 * q) = pack(o0[0], o0[1]);
        *(u32*)(a + unit_at(g + 8, t0, D / 8) + 4 * q) = pack(o0[2], o0[3]);
        *(u32*)(a + unit_at(g, t1, D / 8) + 4 * q) = pack(o1[0], o1[1]);
        *(u32*)(a + unit_at(g + 8, t1, D / 8) + 4 * q) = pack(o1[2], o1[3]);
    }
    cbar();
}

// The tail: the final RMSNorm of the block's 8 columns of x (`kept`, [16, 8] in shared memory,
// once the rows' squares are complete) and their pooling into out [sequences, HID]: mean (0), the
// first token (1) or the last (2) of each sequence. Empty sequences (a graph's padding) get zeros.
// Not inlined: inlined, it made ptxas spill a register across the layers' loop.
__device__ __noinline__ void pool_rows(const float* kept, const float* squares, const int* cu, const u16* final_norm,
                                       float* out, float* rstd, int sequences, int pooling, int n, float eps) {
    int tid = threadIdx.x, b = blockIdx.x;
    if (tid < ROWS) rstd[tid] = tid < n ? rsqrtf(load_cgf(squares + tid) / HID + eps) : 0.f;
    cbar();
    for (int e = tid; e < sequences * 8; e += CONSUMERS) {
        int s = e / 8, c = e % 8, first = cu[s], end = min(cu[s + 1], n);
        float gain = to_f32(final_norm[b * 8 + c]), value = 0.f;
        if (first < end) {
            int from = pooling == 1 ? first : pooling == 2 ? end - 1 : first, to = pooling == 0 ? end : from + 1;
            for (int row = from; row < to; row++) value += round16(gain * round16(kept[row * 8 + c] * rstd[row]));
            value /= to - from;
        }
        out[s * HID + b * 8 + c] = value;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
decoder_layers(const int* ids, const int* cu, const int* count, const u16* embed, const float* rope, float* x,
               u16* qkv, u16* act, u16* xg, unsigned* bar, const u16* in_norm, const u16* w_qkv, const u16* q_norm,
               const u16* k_norm, const u16* w_o, const u16* post_norm, const u16* w_gu, const u16* w_down,
               const u16* final_norm, float* out, int sequences, int pooling, float eps, float scale) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* slots = smem;
    unsigned long long* full = (unsigned long long*)(slots + STAGES * SLOT);
    unsigned long long* empty = full + STAGES;
    float* red = (float*)(empty + STAGES);         // [MAX_CHUNKS, WARPS, 128]
    float* sq = red + MAX_CHUNKS * WARPS * 128;     // [WARPS, 16]
    unsigned char* qs = (unsigned char*)(sq + WARPS * 16);  // [16, D] 16-bit, rows swizzled (unit_at)
    unsigned char* ks = qs + ROWS * D * 2;
    unsigned char* vs = ks + ROWS * D * 2;                  // [16, VSTRIDE bytes]
    unsigned char* a = vs + ROWS * VSTRIDE;                 // O's A operand [16, D] 16-bit, swizzled
    unsigned char* loaded = a + ROWS * D * 2;               // the head's q and k rows [16, 2 D] as loaded

    int tid = threadIdx.x, b = blockIdx.x;
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(full + s, 1), mbar_init(empty + s, WARPS);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        started = -1;
    }
    locate_tokens(cu, sequences);
    __syncthreads();
    if (tid >= CONSUMERS) {
        Weights w = {w_qkv, w_o, w_gu, w_down};
        produce(w, slots, full, empty);
        return;
    }

    int n = *count, warp = tid >> 5;
    Ring ring = {slots, full, empty, 0};
    unsigned epoch = 0;
    // The rows' sums of squares of x, by layer parity: the down phase of layer l adds to
    // squares[(l + 1) & 1], the QKV of layer l + 1 reads it, and block 0 sets it back to zero after
    // the barrier that follows (a launch leaves them at zero, as the barrier).
    float* squares = (float*)(bar + SQUARES);
    const AttnConsts ac = attn_consts(rope, n);
    for (int layer = 0; layer < NLAYERS; layer++) {
        // Loads that need nothing of the phases before them go first.
        NormWeights nw = norm_weights(q_norm + layer * D, k_norm + layer * D);
        // QKV (a thread's epilogue elements lie in one row: 2 * CONSUMERS is a multiple of 128)
        mark_started(layer * 4);
        const int qkv_row = element_row((2 * tid) % 128);
        float row_squares = 0.f;
        if (layer == 0) {
            normed_products<QKV_CHUNKS, true>(NormSource{nullptr, ids, embed}, in_norm, red, sq, ring, n);
            // x starts as the embeddings: the columns' owners (as in the down phase) write them.
            const int row = element_row(tid & 127), col = b * 8 + element_col(tid & 127);
            if (tid < 128 && row < n) x[row * HID + col] = to_f32(embed[(long)ids[row] * HID + col]);
        } else {
            row_squares = load_cgf(squares + (layer & 1) * ROWS + qkv_row);
            uint4 lo[STEPS], hi[STEPS];
            load_rows<HID>(xg, 0, lo, hi, n);
            partial_products<QKV_CHUNKS>(lo, hi, red, ring);
        }
        cbar();
        // Elements e and e + 1 (e even) are neighbours in a row: one 32-bit store.
        for (int e = 2 * tid; e < QKV_CHUNKS * 128; e += 2 * CONSUMERS) {
            int chunk = e / 128, row = qkv_row;
            if (row < n) {
                float r = layer == 0 ? rstd_of(sq, row, eps) : rsqrtf(row_squares / HID + eps);
                *(u32*)(qkv + row * NQKV + b * QC + chunk * 8 + element_col(e % 128)) =
                    pack(reduce(red, chunk, e % 128) * r, reduce(red, chunk, e % 128 + 1) * r);
            }
        }
        grid_sync(bar, ++epoch);

        // Attention and O
        mark_started(layer * 4 + 1);
        attend(qkv, b / O_BLOCKS, nw, ac, loaded, qs, ks, vs, a, n, eps, scale);
        for (int chunk = 0; chunk < O_CHUNKS; chunk++) {
            const unsigned char* w = ring.acquire();
            int row0 = (b % O_BLOCKS) * ORB + chunk * O_ROWS, lane = tid & 31, g = lane >> 2, q = lane & 3;
            for (int tile = warp; tile < O_ROWS / 8; tile += WARPS) {
                float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int s = 0; s < D / 32; s++) {
                    uint4 bw = *(const uint4*)(w + (tile * 8 + g) * D * 2 + (s * 4 + q) * 16);
                    uint4 alo = *(const uint4*)(a + unit_at(g, s * 4 + q, D / 8));
                    uint4 ahi = *(const uint4*)(a + unit_at(g + 8, s * 4 + q, D / 8));
                    mma(c, alo, ahi, bw, false);
                    mma(c, alo, ahi, bw, true);
                }
                int col = row0 + tile * 8 + 2 * q;
                // Lanes q and q ^ 1 swap halves: the even one adds 4 columns of row g, the odd one
                // 4 of row g + 8, a 16-byte atomic each (the barrier after the phase waits for
                // a quarter as many).
                float o0 = __shfl_xor_sync(0xffffffffu, c[0], 1), o1 = __shfl_xor_sync(0xffffffffu, c[1], 1);
                float o2 = __shfl_xor_sync(0xffffffffu, c[2], 1), o3 = __shfl_xor_sync(0xffffffffu, c[3], 1);
                if (!(q & 1) && g < n) red_add4(x + g * HID + col, c[0], c[1], o0, o1);
                if ((q & 1) && g + 8 < n) red_add4(x + (g + 8) * HID + col - 2, o2, o3, c[2], c[3]);
            }
            ring.release();
        }
        grid_sync(bar, ++epoch);

        // Gate-up
        mark_started(layer * 4 + 2);
        if (b == 0 && tid < ROWS) squares[(layer & 1) * ROWS + tid] = 0.f;  // every QKV has read them
        normed_products<GU_CHUNKS, false>(NormSource{x, nullptr, nullptr}, post_norm + layer * HID, red, sq, ring, n);
        cbar();
        for (int e = 2 * tid; e < GC / 8 * 128; e += 2 * CONSUMERS) {
            int task = e / 128, row = element_row(e % 128);
            if (row < n) {
                float r = rstd_of(sq, row, eps), out[2];
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    float gate = reduce(red, 2 * task, e % 128 + i) * r, up = reduce(red, 2 * task + 1, e % 128 + i) * r;
                    out[i] = gate / (1.f + __expf(-gate)) * up;
                }
                *(u32*)(act + row * INTER + b * GC + task * 8 + element_col(e % 128)) = pack(out[0], out[1]);
            }
        }
        grid_sync(bar, ++epoch);

        // Down
        mark_started(layer * 4 + 3);
        const int row = element_row(tid & 127), col = b * 8 + element_col(tid & 127);
        const float old = tid < 128 && row < n ? load_cgf(x + row * HID + col) : 0.f;  // no one else writes it now
        {
            float c[4] = {0.f, 0.f, 0.f, 0.f};
            uint4 dlo[DOWN_CHUNKS][STEPS], dhi[DOWN_CHUNKS][STEPS];  // every load issued before the first use
#pragma unroll
            for (int part = 0; part < DOWN_CHUNKS; part++) load_rows<INTER>(act, part * HID, dlo[part], dhi[part], n);
#pragma unroll
            for (int part = 0; part < DOWN_CHUNKS; part++) {
                chunk_product(c, dlo[part], dhi[part], ring.acquire());
                ring.release();
            }
            *(float4*)(red + warp * 128 + (tid & 31) * 4) = make_float4(c[0], c[1], c[2], c[3]);
        }
        cbar();
        if (tid < 128) {
            float value = old + reduce(red, 0, tid);  // 0 past row n
            const bool last = layer + 1 == NLAYERS;
            if (last) {
                value = round16(value);  // the final norm reads x in 16 bits, as the layer-by-layer path
                sq[row * 8 + (col & 7)] = value;
            } else {
                if (row < n) x[row * HID + col] = value;
                float scaled = value * to_f32(in_norm[(layer + 1) * HID + col]);
                float next = __shfl_xor_sync(0xffffffffu, scaled, 1);  // the element at col + 1
                if (!(tid & 1) && row < n) *(u32*)(xg + row * HID + col) = pack(scaled, next);
            }
            // Lanes that differ in bits 0, 2 and 3 hold the row's 8 columns.
            float square = value * value;
            square += __shfl_xor_sync(0xffffffffu, square, 1);
            square += __shfl_xor_sync(0xffffffffu, square, 4);
            square += __shfl_xor_sync(0xffffffffu, square, 8);
            if (!(tid & 13) && row < n) atomicAdd(squares + ((layer + 1) & 1) * ROWS + row, square);
        }
        grid_sync(bar, ++epoch);
    }
    pool_rows(sq, squares + (NLAYERS & 1) * ROWS, cu, final_norm, out, red, sequences, pooling, n, eps);
    // The last block out sets the barrier back for the next launch (every other block has left it).
    cbar();
    if (tid == 0 && atomicAdd(bar + 1, 1u) == GRID - 1) {
        atomicExch(bar, 0u);
        atomicExch(bar + 1, 0u);
        for (int row = 0; row < ROWS; row++) squares[(NLAYERS & 1) * ROWS + row] = 0.f;  // read by every block
    }
}
