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
//  * Local-memory tiles TSK x TSM of A and TSK x TSN of B, double buffered:
//    the tile for step t+1 is fetched while step t is computed (kernel 9).
//  * Wide vector loads (WIDTH lanes) from global memory (kernel 10); A is
//    k-major so both tiles are read along their contiguous dimension.
//  * PADA / PADB pad the local tile rows (bank-conflict tuning knob).
// Every parameter has a default; the host passes tuned values with -D.
#include "common.cl"

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
#ifndef PADA
#define PADA 0
#endif
#ifndef PADB
#define PADB 0
#endif

#define RTSM (TSM / WPTM)            // work-items along M
#define RTSN (TSN / WPTN)            // work-items along N
#define NTHREADS (RTSM * RTSN)
#define LDAS (TSM + PADA)            // local row pitch of the A tile
#define LDBS (TSN + PADB)
#define A_VECS (TSK * TSM / WIDTH)   // vectors in one A tile
#define B_VECS (TSK * TSN / WIDTH)

#if (TSM % WPTM) || (TSN % WPTN)
#error "TSM and TSN must be multiples of WPTM and WPTN"
#endif
#if (TSM % WIDTH) || (TSN % WIDTH) || (PADA % WIDTH) || (PADB % WIDTH)
#error "TSM, TSN, PADA and PADB must be multiples of WIDTH"
#endif
#if (A_VECS % NTHREADS) || (B_VECS % NTHREADS)
#error "each work-item must load a whole number of vectors of each tile"
#endif

// Copy the TSK-deep slices of AT and B that start at row k0 into local memory.
inline void load_tiles(const __global real* restrict AT,
                       const __global real* restrict B,
                       const int M, const int N, const int k0,
                       const int offsetM, const int offsetN, const int tid,
                       __local real* As, __local real* Bs)
{
    #pragma unroll
    for (int l = 0; l < A_VECS / NTHREADS; l++) {
        const int id = l * NTHREADS + tid;
        const int row = id / (TSM / WIDTH);
        const int col = (id % (TSM / WIDTH)) * WIDTH;
        const realV v = VLOAD(0, AT + (size_t)(k0 + row) * M + offsetM + col);
        VSTORE(v, 0, As + row * LDAS + col);
    }
    #pragma unroll
    for (int l = 0; l < B_VECS / NTHREADS; l++) {
        const int id = l * NTHREADS + tid;
        const int row = id / (TSN / WIDTH);
        const int col = (id % (TSN / WIDTH)) * WIDTH;
        const realV v = VLOAD(0, B + (size_t)(k0 + row) * N + offsetN + col);
        VSTORE(v, 0, Bs + row * LDBS + col);
    }
}

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
    const int offsetN = TSN * get_group_id(0);
    const int offsetM = TSM * get_group_id(1);

    __local real Asub[2][TSK * LDAS];
    __local real Bsub[2][TSK * LDBS];

    real acc[WPTM][WPTN];
    #pragma unroll
    for (int wm = 0; wm < WPTM; wm++) {
        #pragma unroll
        for (int wn = 0; wn < WPTN; wn++) {
            acc[wm][wn] = ZERO;
        }
    }

    const int numTiles = K / TSK;
    if (numTiles > 0) {
        load_tiles(AT, B, M, N, 0, offsetM, offsetN, tid, Asub[0], Bsub[0]);
    }
    for (int t = 0; t < numTiles; t++) {
        // One barrier per step: tile t is complete, and everyone is done
        // with buffer (t+1)%2, which held tile t-1.
        barrier(CLK_LOCAL_MEM_FENCE);
        if (t + 1 < numTiles) {
            load_tiles(AT, B, M, N, (t + 1) * TSK, offsetM, offsetN, tid,
                       Asub[(t + 1) % 2], Bsub[(t + 1) % 2]);
        }
        const __local real* As = Asub[t % 2];
        const __local real* Bs = Bsub[t % 2];
        #pragma unroll
        for (int k = 0; k < TSK; k++) {
            real areg[WPTM];
            real breg[WPTN];
            #pragma unroll
            for (int wm = 0; wm < WPTM; wm++) {
                areg[wm] = As[k * LDAS + tidm + wm * RTSM];
            }
            #pragma unroll
            for (int wn = 0; wn < WPTN; wn++) {
                breg[wn] = Bs[k * LDBS + tidn + wn * RTSN];
            }
            #pragma unroll
            for (int wm = 0; wm < WPTM; wm++) {
                #pragma unroll
                for (int wn = 0; wn < WPTN; wn++) {
                    acc[wm][wn] = fma(areg[wm], breg[wn], acc[wm][wn]);
                }
            }
        }
    }

    // beta == 0 must not read C (BLAS semantics): C may hold garbage or NaN.
    #pragma unroll
    for (int wm = 0; wm < WPTM; wm++) {
        const int row = offsetM + tidm + wm * RTSM;
        #pragma unroll
        for (int wn = 0; wn < WPTN; wn++) {
            const int col = offsetN + tidn + wn * RTSN;
            const size_t idx = (size_t)row * N + col;
            real r = alpha * acc[wm][wn];
            if (beta != ZERO) {
                r = fma(beta, C[idx], r);
            }
            C[idx] = r;
        }
    }
}
