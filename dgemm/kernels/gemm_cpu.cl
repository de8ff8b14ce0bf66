// GEMM for CPU OpenCL devices (GEMMK=1): no barrier, packed panels, a
// register block in vectors.  Same contract as gemm.cl:
//
//   C = alpha * AT^T * B + beta * C
//
//   AT : K x M, row-major (A stored k-major, i.e. already transposed)
//   B  : K x N, row-major
//   C  : M x N, row-major; M, N, K multiples of TSM, TSN, TSK (host padding)
//
// Why a kernel of its own: on a CPU, local memory is plain memory, and a
// barrier splits a kernel into regions between which PoCL keeps every
// work-item's private variables in memory, so gemm.cl's register block
// lives in memory there (0.0006 TFLOPS on 2 cores; bench/NOTES.md, issue 16).
//
// One work-item per work-group computes a TSM x TSN tile of C, the way a
// BLAS on a CPU does (BLIS's loops):
//  * For each block of TSK along K it packs its slices of A and B into
//    contiguous panels in local memory: WPTM-row panels of A and WPTN-column
//    panels of B, each TSK deep.  The inputs' rows are M and N elements
//    apart; read straight from them, a panel at power-of-two M or N falls
//    into a few cache sets and one page per row (TLB misses), and its loads
//    miss even when it is small (0.004 TFLOPS at 2048^2 without packing).
//  * Over the packed panels, a 2D register block (Nugteren's kernel 10):
//    WPTM x WPTN of C in registers, B read in vectors of VWN lanes (float8 is
//    one AVX register), each A element one scalar load broadcast across the
//    vector.  BLAS micro-kernels use 6 x 16 floats (12 AVX accumulators); the
//    tuner chose 2 x 32 on PoCL's AMD EPYC (8 accumulators, 4 B vectors).
//  * B's column panel (TSK x WPTN) is reused from L1 across all of A's row
//    panels; the packed A block (TSK x TSM) stays in L2.
//  * The first K block writes alpha*AB (+ beta*C) to C, later ones add to it.
// Every parameter has a default; the host passes tuned values with -D.
#include "common.cl"

#ifndef MMA
#define MMA 0
#endif
#ifndef GEMMK
#define GEMMK 0
#endif
#if MMA == 0 && GEMMK == 1

#ifndef TSM
#define TSM 48
#endif
#ifndef TSN
#define TSN 64
#endif
#ifndef TSK
#define TSK 64
#endif
#ifndef WPTM
#define WPTM 6
#endif
#ifndef WPTN
#define WPTN 16
#endif
#ifndef VWN
#define VWN 8
#endif

#define NVN (WPTN / VWN)             // vectors per row of the register block

#if (TSM % WPTM) || (TSN % WPTN) || (WPTN % VWN)
#error "TSM, TSN must be multiples of WPTM, WPTN and WPTN of VWN"
#endif

#define CPU_CAT_(a, b) a##b
#define CPU_CAT(a, b) CPU_CAT_(a, b)

// Plain loads, stores and a*b+c, not vloadN/vstoreN/fma: PoCL 3.0 calls those
// builtins out of line (_cl_vload8, _cl_fma in the compiled kernel), which keeps
// the accumulators in memory across the calls.  realNu is realN aligned as
// its element only (vloadN's contract): it compiles to unaligned vector moves.
// a*b+c in one expression is contracted to an FMA instruction (OpenCL's
// default FP_CONTRACT ON) where the device has one.
#if VWN == 1
typedef real realN;
#else
typedef CPU_CAT(real, VWN) realN;
#endif
typedef realN __attribute__((aligned(sizeof(real)))) realNu;
#define LOADN(p) (*(const __global realNu*)(p))
#define STOREN(v, p) (*(__global realNu*)(p) = (v))
#define MADD(a, b, c) ((a) * (b) + (c))

// Unrolling of the innermost K loop: 1, 2, 4 and 8 ran alike (bench/NOTES.md, issue 16).
#ifndef KUNROLL
#define KUNROLL 4
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void gemm(const int M, const int N, const int K,
          const real alpha, const real beta,
          const __global real* restrict AT,
          const __global real* restrict B,
          __global real* C)
{
    TILE_ORIGIN(offsetM, offsetN);
    // Ap: TSM/WPTM panels of TSK x WPTM; Bp: TSN/WPTN panels of TSK x WPTN; each contiguous.
    // Aligned for the widest vector (double16) read from them.
    __local real Ap[TSK * TSM] __attribute__((aligned(128)));
    __local real Bp[TSK * TSN] __attribute__((aligned(128)));

    for (int k0 = 0; k0 < K; k0 += TSK) {
        const __global real* a = AT + (size_t)k0 * M + offsetM;
        for (int k = 0; k < TSK; k++, a += M) {
            for (int i = 0; i < TSM / WPTM; i++) {
                #pragma unroll
                for (int r = 0; r < WPTM; r++) {
                    Ap[(i * TSK + k) * WPTM + r] = a[i * WPTM + r];
                }
            }
        }
        const __global real* b = B + (size_t)k0 * N + offsetN;
        for (int k = 0; k < TSK; k++, b += N) {
            for (int j = 0; j < TSN / WPTN; j++) {
                #pragma unroll
                for (int g = 0; g < NVN; g++) {
                    *(__local realN*)(Bp + (j * TSK + k) * WPTN + g * VWN) = LOADN(b + j * WPTN + g * VWN);
                }
            }
        }

        for (int j = 0; j < TSN / WPTN; j++) {
            const __local realN* bp = (const __local realN*)(Bp + j * TSK * WPTN);
            for (int i = 0; i < TSM / WPTM; i++) {
                const __local real* ap = Ap + i * TSK * WPTM;
                realN acc[WPTM][NVN];
                #pragma unroll
                for (int wm = 0; wm < WPTM; wm++) {
                    #pragma unroll
                    for (int g = 0; g < NVN; g++) {
                        acc[wm][g] = (realN)ZERO;
                    }
                }
                #pragma unroll KUNROLL
                for (int k = 0; k < TSK; k++) {
                    realN bv[NVN];
                    #pragma unroll
                    for (int g = 0; g < NVN; g++) {
                        bv[g] = bp[k * NVN + g];
                    }
                    #pragma unroll
                    for (int wm = 0; wm < WPTM; wm++) {
                        const realN av = (realN)ap[k * WPTM + wm];
                        #pragma unroll
                        for (int g = 0; g < NVN; g++) {
                            acc[wm][g] = MADD(av, bv[g], acc[wm][g]);
                        }
                    }
                }
                // The first K block writes alpha*AB (+ beta*C), later ones add to it.
                // beta == 0 must not read C (BLAS semantics): C may hold garbage or NaN.
                __global real* c = C + (size_t)(offsetM + i * WPTM) * N + offsetN + j * WPTN;
                #pragma unroll
                for (int wm = 0; wm < WPTM; wm++) {
                    #pragma unroll
                    for (int g = 0; g < NVN; g++) {
                        __global real* pc = c + (size_t)wm * N + g * VWN;
                        realN r = (realN)alpha * acc[wm][g];
                        if (k0 > 0) {
                            r += LOADN(pc);
                        } else if (beta != ZERO) {
                            r = MADD((realN)beta, LOADN(pc), r);
                        }
                        STOREN(r, pc);
                    }
                }
            }
        }
    }
}

#endif  // MMA == 0 && GEMMK == 1
