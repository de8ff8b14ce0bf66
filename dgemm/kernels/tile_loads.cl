// Global -> local tile loading shared by the GEMM kernels.
//
// Each work-item moves LPTA vectors of the TSK x TSM tile of AT and LPTB of
// the TSK x TSN tile of B (WIDTH lanes each, read along the contiguous
// dimension).  The next tile's loads go to registers (TILE_FETCH) before the
// current tile is computed and to local memory (TILE_COMMIT) after it, so
// their latency hides behind the arithmetic (double-buffered local memory,
// seed kernel 9, plus register staging).
//
// The including kernel defines TSM, TSN, TSK, WIDTH, NTHREADS, LDAS, LDBS.
#ifndef DGEMM_TILE_LOADS_CL
#define DGEMM_TILE_LOADS_CL

#define A_VECS (TSK * TSM / WIDTH)   // global vectors in one A tile
#define B_VECS (TSK * TSN / WIDTH)
#define LPTA (A_VECS / NTHREADS)     // ... loaded by each work-item
#define LPTB (B_VECS / NTHREADS)

#if (TSM % WIDTH) || (TSN % WIDTH) || (PADA % WIDTH) || (PADB % WIDTH)
#error "TSM, TSN, PADA and PADB must be multiples of WIDTH"
#endif
#if (A_VECS % NTHREADS) || (B_VECS % NTHREADS)
#error "each work-item must load a whole number of vectors of each tile"
#endif

// Declares this work-item's source pointers and local offsets (fixed for all tiles).
#define TILE_SETUP(AT, B, M, N, offsetM, offsetN, tid)                          \
    const __global real* pa[LPTA];                                              \
    const __global real* pb[LPTB];                                              \
    int la[LPTA], lb[LPTB];                                                     \
    _Pragma("unroll")                                                           \
    for (int l = 0; l < LPTA; l++) {                                            \
        const int id = l * NTHREADS + (tid);                                    \
        const int row = id / (TSM / WIDTH);                                     \
        const int col = (id % (TSM / WIDTH)) * WIDTH;                           \
        pa[l] = (AT) + (size_t)row * (M) + (offsetM) + col;                     \
        la[l] = row * LDAS + col;                                               \
    }                                                                           \
    _Pragma("unroll")                                                           \
    for (int l = 0; l < LPTB; l++) {                                            \
        const int id = l * NTHREADS + (tid);                                    \
        const int row = id / (TSN / WIDTH);                                     \
        const int col = (id % (TSN / WIDTH)) * WIDTH;                           \
        pb[l] = (B) + (size_t)row * (N) + (offsetN) + col;                      \
        lb[l] = row * LDBS + col;                                               \
    }                                                                           \
    const size_t stepA = (size_t)TSK * (M);                                     \
    const size_t stepB = (size_t)TSK * (N);                                     \
    realV ra[LPTA], rb[LPTB]

// Tile t straight into local memory (the first tile: nothing to overlap with).
#define TILE_LOAD_DIRECT(t, As, Bs)                                             \
    do {                                                                        \
        const size_t oa = (size_t)(t) * stepA, ob = (size_t)(t) * stepB;        \
        _Pragma("unroll")                                                       \
        for (int l = 0; l < LPTA; l++) VSTORE(VLOAD(0, pa[l] + oa), 0, (As) + la[l]); \
        _Pragma("unroll")                                                       \
        for (int l = 0; l < LPTB; l++) VSTORE(VLOAD(0, pb[l] + ob), 0, (Bs) + lb[l]); \
    } while (0)

// Issue tile t's global loads into registers.
#define TILE_FETCH(t)                                                           \
    do {                                                                        \
        const size_t oa = (size_t)(t) * stepA, ob = (size_t)(t) * stepB;        \
        _Pragma("unroll")                                                       \
        for (int l = 0; l < LPTA; l++) ra[l] = VLOAD(0, pa[l] + oa);            \
        _Pragma("unroll")                                                       \
        for (int l = 0; l < LPTB; l++) rb[l] = VLOAD(0, pb[l] + ob);            \
    } while (0)

// Write the fetched tile into local memory.
#define TILE_COMMIT(As, Bs)                                                     \
    do {                                                                        \
        _Pragma("unroll")                                                       \
        for (int l = 0; l < LPTA; l++) VSTORE(ra[l], 0, (As) + la[l]);          \
        _Pragma("unroll")                                                       \
        for (int l = 0; l < LPTB; l++) VSTORE(rb[l], 0, (Bs) + lb[l]);          \
    } while (0)

// TILE_ORIGIN (the work-group's corner of C) is in common.cl: gemm_cpu.cl uses it too.

#endif  // DGEMM_TILE_LOADS_CL
