// Register-blocked, local-memory tiled GEMM:  C = alpha * AT^T * B + beta * C
//
//   AT : K x M, row-major (A stored k-major, i.e. already transposed)
//   B  : K x N, row-major
//   C  : M x N, row-major
//
// M, N, K are multiples of TSM, TSN, TSK: the host zero-pads edge blocks
// (padding.cl, transpose.cl) so no bounds checks are needed here.
//
// Techniques (see the seeds):
//  * 2D register blocking: each work-item owns a WPTM x WPTN sub-tile of C,
//    rectangular and not necessarily a power of two (kernel 10).
//  * Local-memory tiles TSK x TSM of A and TSK x TSN of B, double buffered
//    (kernel 9).  The next tile's global loads are issued into registers
//    before the current tile is computed and stored to the other buffer
//    after it, so their latency hides behind the arithmetic and one barrier
//    per tile suffices.
//  * Wide vector loads (WIDTH lanes) from global memory (kernel 10); A is
//    k-major so both tiles are read along their contiguous dimension.
//  * Vector reads from local memory: a work-item owns groups of VWM adjacent
//    rows and VWN adjacent columns, fetched with one wide local load each.
//  * PADA / PADB pad the local tile rows (bank-conflict tuning knob).
//  * GROUPM > 0 reorders the work-groups in bands of GROUPM tile rows, so the
//    groups that run at the same time share A rows and B columns in L2.
//  * STAGES >= 2 (NVIDIA sm_80+ only, tile_loads.cl): the tiles come by
//    cp.async into a ring of STAGES local tiles instead of through registers
//    into two; the registers the prefetch held are free for the register
//    block, and STAGES - 1 tiles are in flight.
//  * FRAGPREFETCH 1 (with STAGES >= 3): the next tile's first row of A and B
//    is read into registers while this tile's last FMAs run, so the first
//    FMAs after the barrier do not wait for local memory.
// Every parameter has a default; the host passes tuned values with -D.
#include "common.cl"

#ifndef MMA
#define MMA 0
#endif
#ifndef GEMMK
#define GEMMK 0
#endif
// the FMA kernel; gemm_dmma.cl holds the tensor-core one, gemm_cpu.cl the one without local memory (GEMMK=1)
#if MMA == 0 && GEMMK == 0

#ifndef TSM
#define TSM 64
#endif
#ifndef TSN
#define TSN 64
#endif
#ifndef TSK
#define TSK 16
#endif
#ifndef WPTM
#define WPTM 4
#endif
#ifndef WPTN
#define WPTN 4
#endif
#ifndef VWM
#define VWM 1
#endif
#ifndef VWN
#define VWN 1
#endif
#ifndef PADA
#define PADA 0
#endif
#ifndef PADB
#define PADB 0
#endif
#ifndef GROUPM
#define GROUPM 0
#endif
#ifndef FRAGPREFETCH
#if defined(STAGES) && STAGES >= 3
#define FRAGPREFETCH 1               // the ring's default: 47.3 against 42.9 TFLOPS without (ring 3, H100, 8192^3)
#else
#define FRAGPREFETCH 0
#endif
#endif

#define RTSM (TSM / WPTM)            // work-items along M
#define RTSN (TSN / WPTN)            // work-items along N
#define NTHREADS (RTSM * RTSN)
#define LDAS (TSM + PADA)            // local row pitch of the A tile
#define LDBS (TSN + PADB)

#if (TSM % WPTM) || (TSN % WPTN)
#error "TSM and TSN must be multiples of WPTM and WPTN"
#endif
#if (WPTM % VWM) || (WPTN % VWN) || (PADA % VWM) || (PADB % VWN)
#error "WPTM, PADA must be multiples of VWM and WPTN, PADB of VWN"
#endif

#if FRAGPREFETCH && STAGES < 3
#error "FRAGPREFETCH reads the next tile from the cp.async ring: it needs STAGES >= 3"
#endif
#define TILE_RING_LOOKAHEAD FRAGPREFETCH   // iteration t reads tile t + 1's first k-row

#include "tile_loads.cl"

#if SWIZZLE
#error "SWIZZLE is gemm_dmma.cl's: this kernel reads its tiles unswizzled"
#endif

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

// dst[0..VW) = the VW elements at the (VW-aligned) local address src.
#if VWM == 1
#define LOCAL_READ_M(dst, src) ((dst)[0] = *(src))
#else
#define LOCAL_READ_M(dst, src) CAT(vstore, VWM)(*(const __local CAT(real, VWM)*)(src), 0, (dst))
#endif
#if VWN == 1
#define LOCAL_READ_N(dst, src) ((dst)[0] = *(src))
#else
#define LOCAL_READ_N(dst, src) CAT(vstore, VWN)(*(const __local CAT(real, VWN)*)(src), 0, (dst))
#endif

// Row k of the A and B tiles at As, Bs into this work-item's areg[WPTM], breg[WPTN].
// (Two loop statements: used without a semicolon.)
#define REG_READ(areg, breg, As, Bs, k)                                         \
            _Pragma("unroll")                                                   \
            for (int g = 0; g < WPTM / VWM; g++) {                              \
                LOCAL_READ_M(areg + g * VWM, As + k * LDAS + g * (RTSM * VWM) + tidm * VWM); \
            }                                                                   \
            _Pragma("unroll")                                                   \
            for (int g = 0; g < WPTN / VWN; g++) {                              \
                LOCAL_READ_N(breg + g * VWN, Bs + k * LDBS + g * (RTSN * VWN) + tidn * VWN); \
            }

// Row (column) of the C tile held in register wm (wn) of work-item tidm (tidn).
#define ROW_OF(wm) (((wm) / VWM) * (RTSM * VWM) + tidm * VWM + (wm) % VWM)
#define COL_OF(wn) (((wn) / VWN) * (RTSN * VWN) + tidn * VWN + (wn) % VWN)

// Local size (RTSN, RTSM): dimension 0 runs along N, the contiguous
// dimension of C, so neighbouring work-items store neighbouring elements.
__kernel __attribute__((reqd_work_group_size(RTSN, RTSM, 1)))
void gemm(const int M, const int N, const int K,
          const real alpha, const real beta,
          const __global real* restrict AT,
          const __global real* restrict B,
          __global real* C)
{
    const int tidn = get_local_id(0);
    const int tidm = get_local_id(1);
    const int tid = tidm * RTSN + tidn;
    TILE_ORIGIN(offsetM, offsetN);

    __local real Asub[TILE_STAGES][TSK * LDAS] __attribute__((aligned(16)));
    __local real Bsub[TILE_STAGES][TSK * LDBS] __attribute__((aligned(16)));
    TILE_SETUP(AT, B, M, N, offsetM, offsetN, tid);

    real acc[WPTM][WPTN];
    #pragma unroll
    for (int wm = 0; wm < WPTM; wm++) {
        #pragma unroll
        for (int wn = 0; wn < WPTN; wn++) {
            acc[wm][wn] = ZERO;
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
#if FRAGPREFETCH
    TILE_RING_FIRST();
    real fa[WPTM], fb[WPTN];   // row 0 of the tile computed next
    REG_READ(fa, fb, Asub[0], Bsub[0], 0)
#endif

    for (int t = 0; t < numTiles; t++) {
#if STAGES
        TILE_RING_REFILL(t, Asub, Bsub, numTiles);
        const __local real* As = Asub[TILE_RING_STAGE];
        const __local real* Bs = Bsub[TILE_RING_STAGE];
#else
        const int more = t + 1 < numTiles;
        if (more) {  // issue the next tile's global loads now; use them after the arithmetic
            TILE_FETCH(t + 1);
        }
        const __local real* As = Asub[t & 1];
        const __local real* Bs = Bsub[t & 1];
#endif
        #pragma unroll
        for (int k = 0; k < TSK; k++) {
            real areg[WPTM];
            real breg[WPTN];
#if FRAGPREFETCH
            if (k == 0) {   // read in the previous iteration (or before the loop)
                #pragma unroll
                for (int wm = 0; wm < WPTM; wm++) areg[wm] = fa[wm];
                #pragma unroll
                for (int wn = 0; wn < WPTN; wn++) breg[wn] = fb[wn];
            } else {
                REG_READ(areg, breg, As, Bs, k)
            }
            if (k == TSK - 1) {   // the next tile's first k-row, while this one's FMAs run
                REG_READ(fa, fb, Asub[TILE_RING_NEXT], Bsub[TILE_RING_NEXT], 0)
            }
#else
            REG_READ(areg, breg, As, Bs, k)
#endif
            #pragma unroll
            for (int wm = 0; wm < WPTM; wm++) {
                #pragma unroll
                for (int wn = 0; wn < WPTN; wn++) {
                    acc[wm][wn] = fma(areg[wm], breg[wn], acc[wm][wn]);
                }
            }
        }
#if STAGES
        TILE_RING_ADVANCE();
#else
        if (more) {  // the other buffer held tile t-1, which everyone finished before the last barrier
            TILE_COMMIT(Asub[(t + 1) & 1], Bsub[(t + 1) & 1]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
    }

    // beta == 0 must not read C (BLAS semantics): C may hold garbage or NaN.
    #pragma unroll
    for (int wm = 0; wm < WPTM; wm++) {
        const int row = offsetM + ROW_OF(wm);
        #pragma unroll
        for (int wn = 0; wn < WPTN; wn++) {
            const int col = offsetN + COL_OF(wn);
            const size_t idx = (size_t)row * N + col;
            real r = alpha * acc[wm][wn];
            if (beta != ZERO) {
                r = fma(beta, C[idx], r);
            }
            C[idx] = r;
        }
    }
}

#endif  // MMA == 0 && GEMMK == 0
