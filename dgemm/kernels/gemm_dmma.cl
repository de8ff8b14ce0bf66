// Float64 GEMM on the tensor cores (DMMA) through inline PTX, for NVIDIA
// GPUs of compute capability >= 8.0 (MMA=1: mma.m8n8k4) or 9.0 (MMA=2, 3, 4:
// m16n8k4, m16n8k8, m16n8k16, Hopper's larger f64 shapes).  Same contract and the same tile
// loading as gemm.cl (C = alpha * AT^T * B + beta * C, padded sizes); built
// only with -DMMA=1, which the host passes only for such devices.
//
// A work-group of WARPSM x WARPSN warps computes a TSM x TSN tile of C; each
// warp owns a (TSM/WARPSM) x (TSN/WARPSN) block of 8x8 fragments and issues
// mma.sync.m8n8k4 (f64) per fragment and k-step of 4.  Fragment layout (PTX
// ISA): lane l = 4*g + q holds A[g][q], B[q][g] and C[g][2q], C[g][2q+1].
// PADA/PADB = 4 (mod 16) puts the four k-rows a half-warp reads in distinct
// banks.
//
// Options (macros; 0 is the first version):
//  * STAGES >= 2 (tile_loads.cl): the tiles come by cp.async into a ring of
//    STAGES local tiles instead of through registers into two, so the
//    prefetch holds no registers and runs STAGES - 1 tiles ahead.
//  * FRAGPAIRS 1: a lane reads the elements of two fragments with one
//    16-byte local load (ld.shared.v2.f64) instead of two 8-byte ones.  The
//    pairs are fragments i, i+1 along M (and j, j+1 along N): a lane's rows
//    g of fragment i and g of fragment i+1 are the tile's rows 2g, 2g+1 of
//    that pair's 16, adjacent in the k-major tile.  Only which fragment
//    element is which row (column) changes, so the copies stay whole 16-byte
//    rows, cp.async as well; the stores of C follow the same map.  (A k-pair
//    layout, k and k+4 side by side, would pair the same way but needs the
//    copies split into 8-byte pieces.)  With PADA = PADB = 4 (mod 16) the
//    eight lanes of each 16-byte access phase hit distinct banks.
//  * FRAGPREFETCH 1 (with STAGES >= 3): the next tile's first fragments are
//    read while this tile's last MMAs run (the ring waits for tile t + 1 at
//    the top of iteration t), so no MMA waits for local-memory latency after
//    the barrier; one more fragment set of registers, one tile less ahead.
//  * SWIZZLE 1 (with STAGES >= 2): unpadded tiles with their 16-byte pieces
//    permuted per k-row (tile_loads.cl), read through TILE_SWZ: no bank
//    conflicts and no padding, so 128 x 128 x 8 float64 tiles fit three
//    stages in 48 KiB.
//  * Larger warp tiles are parameters: TSM / WARPSM and TSN / WARPSN.
#include "common.cl"

#ifndef MMA
#define MMA 0
#endif
#if MMA >= 1

#if MMA <= 4 && PRECISION != 64
#error "MMA 1-4 (DMMA) are float64 only"
#endif
#if MMA >= 5 && PRECISION != 32
#error "MMA 5-6 (TF32, 3xTF32) are float32 only"
#endif

#ifndef TSM
#define TSM 64
#endif
#ifndef TSN
#define TSN 64
#endif
#ifndef TSK
#define TSK 16
#endif
#ifndef WARPSM
#define WARPSM 2
#endif
#ifndef WARPSN
#define WARPSN 2
#endif
#ifndef PADA
#define PADA 4
#endif
#ifndef PADB
#define PADB 4
#endif
#ifndef GROUPM
#define GROUPM 0
#endif
#ifndef FRAGPAIRS
#define FRAGPAIRS 0
#endif
#ifndef FRAGPREFETCH
#define FRAGPREFETCH 0
#endif

#define NTHREADS (32 * WARPSM * WARPSN)
#define WTM (TSM / WARPSM)           // warp tile
#define WTN (TSN / WARPSN)
#define MT (WTM / 8)                 // 8x8 fragments per warp
#define NT (WTN / 8)
#define LDAS (TSM + PADA)
#define LDBS (TSN + PADB)

// k per instruction; m16 shapes pair the 8-row fragments i, i+1 of a warp.
#if MMA == 1
#define KSTEP 4
#elif MMA == 2
#define KSTEP 4
#elif MMA == 3
#define KSTEP 8
#elif MMA == 4
#define KSTEP 16
#elif MMA == 5 || MMA == 6
#define KSTEP 8
#else
#error "MMA must be 1-4 (f64: m8n8k4, m16n8k4, m16n8k8, m16n8k16) or 5-6 (f32: TF32, 3xTF32)"
#endif
#define KSUB (KSTEP / 4)

#if (TSM % (8 * WARPSM)) || (TSN % (8 * WARPSN)) || (TSK % KSTEP)
#error "TSM, TSN must be multiples of 8 * WARPSM, 8 * WARPSN and TSK of the instruction's k"
#endif
#if MMA >= 2 && (MT % 2)
#error "the m16 shapes need an even number of 8-row fragments per warp"
#endif
#if FRAGPAIRS && ((MT % 2) || (NT % 2) || (PADA % 2) || (PADB % 2))
#error "FRAGPAIRS reads fragments in pairs: an even number of them per warp along M and N, even PADA and PADB"
#endif
#if FRAGPREFETCH && STAGES < 3
#error "FRAGPREFETCH reads the next tile from the cp.async ring: it needs STAGES >= 3"
#endif
#define TILE_RING_LOOKAHEAD FRAGPREFETCH   // iteration t reads tile t + 1's first fragments

#include "tile_loads.cl"

// The fragments of k-step kk (k = kk .. kk + KSTEP - 1) of the tiles at As, Bs into
// a[KSUB][MT], b[KSUB][NT]: lane (g, q) takes k-row kk + 4s + q of each k-substep s.
// (A loop statement: used without a semicolon.)
#if FRAGPAIRS
#define FRAG_LOAD(a, b, As, Bs, kk)                                            \
            _Pragma("unroll")                                                  \
            for (int s = 0; s < KSUB; s++) {                                   \
                const int k = (kk) + 4 * s + q;                                \
                _Pragma("unroll")                                              \
                for (int i = 0; i < MT; i += 2) {                              \
                    const real2 v = *(const __local real2*)((As) + k * LDAS + TILE_SWZ(arow + i * 8, k)); \
                    a[s][i] = v.x;                                             \
                    a[s][i + 1] = v.y;                                         \
                }                                                              \
                _Pragma("unroll")                                              \
                for (int j = 0; j < NT; j += 2) {                              \
                    const real2 v = *(const __local real2*)((Bs) + k * LDBS + TILE_SWZ(bcol + j * 8, k)); \
                    b[s][j] = v.x;                                             \
                    b[s][j + 1] = v.y;                                         \
                }                                                              \
            }
#else   // (TILE_SWZ is the identity without SWIZZLE)
#define FRAG_LOAD(a, b, As, Bs, kk)                                            \
            _Pragma("unroll")                                                  \
            for (int s = 0; s < KSUB; s++) {                                   \
                const int k = (kk) + 4 * s + q;                                \
                _Pragma("unroll")                                              \
                for (int i = 0; i < MT; i++) a[s][i] = (As)[k * LDAS + TILE_SWZ(arow + i * 8, k)]; \
                _Pragma("unroll")                                              \
                for (int j = 0; j < NT; j++) b[s][j] = (Bs)[k * LDBS + TILE_SWZ(bcol + j * 8, k)]; \
            }
#endif

// Lane 4g+q holds, for k-substep s (k = 4s + q): A rows g and g+8, B column g;
// C rows g, g+8 at columns 2q, 2q+1.
// (tests/test_kernels_source.py defines DMMA..MMA_TF32 and TF32_BITS itself: a CPU emulation of
// these fragment layouts, to check the kernel's index maps on a CPU)
#ifndef DMMA
#define DMMA(c0, c1, a, b)                                                     \
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 "           \
                 "{%0, %1}, {%2}, {%3}, {%0, %1};"                             \
                 : "+d"(c0), "+d"(c1) : "d"(a), "d"(b))
#define DMMA16K4(c0, c1, c2, c3, a0, a1, b0)                                   \
    asm volatile("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 "          \
                 "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"         \
                 : "+d"(c0), "+d"(c1), "+d"(c2), "+d"(c3)                      \
                 : "d"(a0), "d"(a1), "d"(b0))
#define DMMA16K8(c0, c1, c2, c3, a0, a1, a2, a3, b0, b1)                       \
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 "          \
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};" \
                 : "+d"(c0), "+d"(c1), "+d"(c2), "+d"(c3)                      \
                 : "d"(a0), "d"(a1), "d"(a2), "d"(a3), "d"(b0), "d"(b1))
#define DMMA16K16(c0, c1, c2, c3, a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3) \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 "         \
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7, %8, %9, %10, %11}, "      \
                 "{%12, %13, %14, %15}, {%0, %1, %2, %3};"                     \
                 : "+d"(c0), "+d"(c1), "+d"(c2), "+d"(c3)                      \
                 : "d"(a0), "d"(a1), "d"(a2), "d"(a3), "d"(a4), "d"(a5),       \
                   "d"(a6), "d"(a7), "d"(b0), "d"(b1), "d"(b2), "d"(b3))
#endif

#if MMA >= 5
// float32 through TF32 tensor cores.  TF32 keeps 10 mantissa bits; 3xTF32
// splits x = big + small (both TF32) and adds small*big + big*small +
// big*big, recovering float32 accuracy (the dropped small*small term is
// below float32 rounding).
#ifndef TF32_BITS
inline uint tf32_bits(const float x)
{
    uint r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
#else
#define tf32_bits TF32_BITS
#endif
#ifndef MMA_TF32
#define MMA_TF32(c0, c1, c2, c3, a0, a1, a2, a3, b0, b1)                      \
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "        \
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};" \
                 : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)                      \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
#endif
#endif

__kernel __attribute__((reqd_work_group_size(32 * WARPSN, WARPSM, 1)))
void gemm(const int M, const int N, const int K,
          const real alpha, const real beta,
          const __global real* restrict AT,
          const __global real* restrict B,
          __global real* C)
{
    const int lane = get_local_id(0) & 31;
    const int wn = get_local_id(0) >> 5;
    const int wm = get_local_id(1);
    const int tid = get_local_id(1) * (32 * WARPSN) + get_local_id(0);
    const int g = lane >> 2, q = lane & 3;
    TILE_ORIGIN(offsetM, offsetN);

    __local real Asub[TILE_STAGES][TSK * LDAS] __attribute__((aligned(16)));
    __local real Bsub[TILE_STAGES][TSK * LDBS] __attribute__((aligned(16)));
    TILE_SETUP(AT, B, M, N, offsetM, offsetN, tid);

    real acc[MT][NT][2];
    #pragma unroll
    for (int i = 0; i < MT; i++) {
        #pragma unroll
        for (int j = 0; j < NT; j++) {
            acc[i][j][0] = ZERO;
            acc[i][j][1] = ZERO;
        }
    }

    const int numTiles = K / TSK;
#if STAGES
    TILE_RING_START(Asub, Bsub, numTiles);
#else
    if (numTiles > 0) {
        TILE_LOAD_DIRECT(0, Asub[0], Bsub[0]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#endif

#if FRAGPAIRS
    const int arow = wm * WTM + 2 * g;   // this lane's rows in each pair of A fragments
    const int bcol = wn * WTN + 2 * g;   // ... and columns in each pair of B fragments
#else
    const int arow = wm * WTM + g;   // this lane's row in each A fragment
    const int bcol = wn * WTN + g;   // ... and column in each B fragment
#endif
#if FRAGPREFETCH
    TILE_RING_FIRST();
    real fa[KSUB][MT], fb[KSUB][NT];   // the first k-step of the tile computed next
    FRAG_LOAD(fa, fb, Asub[0], Bsub[0], 0)
#endif
    for (int t = 0; t < numTiles; t++) {
#if STAGES
        TILE_RING_REFILL(t, Asub, Bsub, numTiles);
        const __local real* As = Asub[TILE_RING_STAGE];
        const __local real* Bs = Bsub[TILE_RING_STAGE];
#else
        const int more = t + 1 < numTiles;
        if (more) {
            TILE_FETCH(t + 1);
        }
        const __local real* As = Asub[t & 1];
        const __local real* Bs = Bsub[t & 1];
#endif
#if MMA == 6
        // The tensor cores' float32 accumulation is not round-to-nearest: its
        // error grows with K.  Each tile accumulates from zero in tacc and is
        // added to acc with IEEE adds, so only TSK terms share a truncation.
        real tacc[MT][NT][2];
        #pragma unroll
        for (int i = 0; i < MT; i++) {
            #pragma unroll
            for (int j = 0; j < NT; j++) {
                tacc[i][j][0] = ZERO;
                tacc[i][j][1] = ZERO;
            }
        }
#define ACC tacc
#else
#define ACC acc
#endif
        #pragma unroll
        for (int kk = 0; kk < TSK; kk += KSTEP) {
            real a[KSUB][MT], b[KSUB][NT];
#if FRAGPREFETCH
            if (kk == 0) {   // read in the previous iteration (or before the loop)
                #pragma unroll
                for (int s = 0; s < KSUB; s++) {
                    #pragma unroll
                    for (int i = 0; i < MT; i++) a[s][i] = fa[s][i];
                    #pragma unroll
                    for (int j = 0; j < NT; j++) b[s][j] = fb[s][j];
                }
            } else {
                FRAG_LOAD(a, b, As, Bs, kk)
            }
            if (kk + KSTEP == TSK) {   // the next tile's first k-step, while this one's MMAs run
                FRAG_LOAD(fa, fb, Asub[TILE_RING_NEXT], Bsub[TILE_RING_NEXT], 0)
            }
#else
            FRAG_LOAD(a, b, As, Bs, kk)
#endif
#if MMA == 1
            #pragma unroll
            for (int i = 0; i < MT; i++) {
                #pragma unroll
                for (int j = 0; j < NT; j++) {
                    DMMA(acc[i][j][0], acc[i][j][1], a[0][i], b[0][j]);
                }
            }
#else
            #pragma unroll
            for (int i = 0; i < MT; i += 2) {
                #pragma unroll
                for (int j = 0; j < NT; j++) {
#if MMA == 2
                    DMMA16K4(acc[i][j][0], acc[i][j][1], acc[i + 1][j][0], acc[i + 1][j][1],
                             a[0][i], a[0][i + 1], b[0][j]);
#elif MMA == 3
                    DMMA16K8(acc[i][j][0], acc[i][j][1], acc[i + 1][j][0], acc[i + 1][j][1],
                             a[0][i], a[0][i + 1], a[1][i], a[1][i + 1], b[0][j], b[1][j]);
#elif MMA == 4
                    DMMA16K16(acc[i][j][0], acc[i][j][1], acc[i + 1][j][0], acc[i + 1][j][1],
                              a[0][i], a[0][i + 1], a[1][i], a[1][i + 1],
                              a[2][i], a[2][i + 1], a[3][i], a[3][i + 1],
                              b[0][j], b[1][j], b[2][j], b[3][j]);
#else
                    {
                        const uint ab0 = tf32_bits(a[0][i]), ab1 = tf32_bits(a[0][i + 1]);
                        const uint ab2 = tf32_bits(a[1][i]), ab3 = tf32_bits(a[1][i + 1]);
                        const uint bb0 = tf32_bits(b[0][j]), bb1 = tf32_bits(b[1][j]);
#if MMA == 6
                        const uint as0 = tf32_bits(a[0][i] - as_float(ab0));
                        const uint as1 = tf32_bits(a[0][i + 1] - as_float(ab1));
                        const uint as2 = tf32_bits(a[1][i] - as_float(ab2));
                        const uint as3 = tf32_bits(a[1][i + 1] - as_float(ab3));
                        const uint bs0 = tf32_bits(b[0][j] - as_float(bb0));
                        const uint bs1 = tf32_bits(b[1][j] - as_float(bb1));
                        // small terms first: they are added while the accumulator is smallest
                        MMA_TF32(ACC[i][j][0], ACC[i][j][1], ACC[i + 1][j][0], ACC[i + 1][j][1],
                                 as0, as1, as2, as3, bb0, bb1);
                        MMA_TF32(ACC[i][j][0], ACC[i][j][1], ACC[i + 1][j][0], ACC[i + 1][j][1],
                                 ab0, ab1, ab2, ab3, bs0, bs1);
#endif
                        MMA_TF32(ACC[i][j][0], ACC[i][j][1], ACC[i + 1][j][0], ACC[i + 1][j][1],
                                 ab0, ab1, ab2, ab3, bb0, bb1);
                    }
#endif
                }
            }
#endif
        }
#if MMA == 6
        #pragma unroll
        for (int i = 0; i < MT; i++) {
            #pragma unroll
            for (int j = 0; j < NT; j++) {
                acc[i][j][0] += tacc[i][j][0];
                acc[i][j][1] += tacc[i][j][1];
            }
        }
#endif
#undef ACC
#if STAGES
        TILE_RING_ADVANCE();
#else
        if (more) {
            TILE_COMMIT(Asub[(t + 1) & 1], Bsub[(t + 1) & 1]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
    }

    #pragma unroll
    for (int i = 0; i < MT; i++) {
#if FRAGPAIRS
        // row g of fragment i is the tile's row 2g (+1 for the odd one of the pair) of the pair's 16
        const int row = offsetM + wm * WTM + (i & ~1) * 8 + 2 * g + (i & 1);
#else
        const int row = offsetM + wm * WTM + i * 8 + g;
#endif
        #pragma unroll
        for (int j = 0; j < NT; j++) {
            #pragma unroll
            for (int h = 0; h < 2; h++) {
#if FRAGPAIRS
                // column n = 2q + h of fragment j: the tile's column 2n (+1 for odd j) of the pair's 16
                const int col = offsetN + wn * WTN + (j & ~1) * 8 + 2 * (2 * q + h) + (j & 1);
#else
                const int col = offsetN + wn * WTN + j * 8 + 2 * q + h;
#endif
                const size_t idx = (size_t)row * N + col;
                real r = alpha * acc[i][j][h];
                if (beta != ZERO) {
                    r = fma(beta, C[idx], r);
                }
                C[idx] = r;
            }
        }
    }
}

#endif  // MMA >= 1
