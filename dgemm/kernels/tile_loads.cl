// Global -> local tile loading shared by the GEMM kernels.
//
// Each work-item moves LPTA vectors of the TSK x TSM tile of AT and LPTB of
// the TSK x TSN tile of B (WIDTH lanes each, read along the contiguous
// dimension).  The next tile's loads go to registers (TILE_FETCH) before the
// current tile is computed and to local memory (TILE_COMMIT) after it, so
// their latency hides behind the arithmetic (double-buffered local memory,
// seed kernel 9, plus register staging).
//
// STAGES >= 2 replaces both with a ring of STAGES local tiles filled by
// cp.async (NVIDIA sm_80+): the copies go global -> local without passing
// through registers, so no registers hold the prefetch, and STAGES - 1 tiles
// are in flight while one is computed (TILE_RING_*, below).
//
// The including kernel defines TSM, TSN, TSK, WIDTH, NTHREADS, LDAS, LDBS.
#ifndef DGEMM_TILE_LOADS_CL
#define DGEMM_TILE_LOADS_CL

#ifndef STAGES
#define STAGES 0
#endif
#ifndef SWIZZLE
#define SWIZZLE 0
#endif
#if STAGES == 1 || STAGES < 0
#error "STAGES is 0 (register prefetch, two local tiles) or at least 2 (a cp.async ring of STAGES tiles)"
#endif
// Local tiles the kernels declare per operand.
#if STAGES >= 2
#define TILE_STAGES STAGES
#else
#define TILE_STAGES 2
#endif

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

// A WIDTH-vector of a tile in global memory.  vloadN promises only element alignment, and NVIDIA's
// compiler then splits it into N scalar loads (ld.global.f64 twice for a double2: half of each
// instruction's sectors wasted, ncu on the DMMA kernel).  The tile's vectors are WIDTH-aligned (TSM, TSN,
// the offsets and the padded sizes are multiples of WIDTH; buffers start aligned), so GLOADS 1 reads
// them as aligned vectors: one ld.global.v2.f64 / v4.f32 (H100: DMMA 43.6 -> 45.0 TFLOPS, the FMA
// kernel's register prefetch with WIDTH 4 38.5 -> 44.5; GLOADS 0 keeps vloadN).
#ifndef GLOADS
#define GLOADS 1
#endif
#if GLOADS && WIDTH > 1
#define GLOAD(p) (*(const __global realV*)(p))
#else
#define GLOAD(p) VLOAD(0, p)
#endif

// Tile t straight into local memory (the first tile: nothing to overlap with).
#define TILE_LOAD_DIRECT(t, As, Bs)                                             \
    do {                                                                        \
        const size_t oa = (size_t)(t) * stepA, ob = (size_t)(t) * stepB;        \
        _Pragma("unroll")                                                       \
        for (int l = 0; l < LPTA; l++) VSTORE(GLOAD(pa[l] + oa), 0, (As) + la[l]); \
        _Pragma("unroll")                                                       \
        for (int l = 0; l < LPTB; l++) VSTORE(GLOAD(pb[l] + ob), 0, (Bs) + lb[l]); \
    } while (0)

// Issue tile t's global loads into registers.
#define TILE_FETCH(t)                                                           \
    do {                                                                        \
        const size_t oa = (size_t)(t) * stepA, ob = (size_t)(t) * stepB;        \
        _Pragma("unroll")                                                       \
        for (int l = 0; l < LPTA; l++) ra[l] = GLOAD(pa[l] + oa);               \
        _Pragma("unroll")                                                       \
        for (int l = 0; l < LPTB; l++) rb[l] = GLOAD(pb[l] + ob);               \
    } while (0)

// Write the fetched tile into local memory.
#define TILE_COMMIT(As, Bs)                                                     \
    do {                                                                        \
        _Pragma("unroll")                                                       \
        for (int l = 0; l < LPTA; l++) VSTORE(ra[l], 0, (As) + la[l]);          \
        _Pragma("unroll")                                                       \
        for (int l = 0; l < LPTB; l++) VSTORE(rb[l], 0, (Bs) + lb[l]);          \
    } while (0)

// SWIZZLE 1: the 16-byte piece c of local row k is stored at c ^ 2(k % 4) instead of c, so
// that tiles without padding (PADA = PADB = 0, which lets three stages of 128 x 128 float64
// tiles fit 48 KiB) are read without bank conflicts: the lanes of one access phase read rows
// k .. k+3 (q) at two adjacent pieces (g), and g ^ 2q spreads those eight over the eight
// pieces of a 128-byte bank line.  Readers address element m of row k as TILE_SWZ(m, k).
// It permutes 16-byte pieces, so the copies must be whole pieces.
#define TILE_SWZ_ELEMS (16 * 8 / PRECISION)             // elements per 16-byte piece
#define TILE_VBYTES (WIDTH * PRECISION / 8)             // bytes per global vector
#if SWIZZLE
#if STAGES < 2
#error "SWIZZLE is laid out by the cp.async copies: it needs STAGES >= 2"
#endif
#if TILE_VBYTES < 16
#error "SWIZZLE moves 16-byte pieces: WIDTH must be 16 bytes or more (float: 4, 8; double: 2, 4, 8)"
#endif
#if (TSM % (8 * TILE_SWZ_ELEMS)) || (TSN % (8 * TILE_SWZ_ELEMS))
#error "SWIZZLE permutes the pieces within groups of 8 (128 bytes): TSM and TSN must be multiples of that"
#endif
#define TILE_SWZ(m, k) ((m) ^ (((k) & 3) * (2 * TILE_SWZ_ELEMS)))
// element e (= row * LD + column) of a local tile, where the copies put it
#define TILE_PLACE(e, LD) ((e) / (LD) * (LD) + TILE_SWZ((e) % (LD), (e) / (LD)))
#else
#define TILE_SWZ(m, k) (m)
#define TILE_PLACE(e, LD) (e)
#endif

#if STAGES >= 2
// ---- the cp.async ring: NVIDIA sm_80+ only ----
//
// Inline asm ("asm volatile") and cp.async exist only in NVIDIA's OpenCL (PoCL and the rest
// cannot build this), so nothing below is compiled unless STAGES >= 2 is passed, and the host
// must pass it only to NVIDIA devices of compute capability >= 8.0; with STAGES 0 (the
// default) the program is the one above, token for token.
#if STAGES * TSK * (LDAS + LDBS) * (PRECISION / 8) > 49152
#error "the STAGES-deep ring exceeds 48 KiB of local memory (NVIDIA's OpenCL limit per work-group)"
#endif
#define TILE_STR_(x) #x
#define TILE_STR(x) TILE_STR_(x)

// One global vector of TILE_SETUP (WIDTH elements) is one cp.async when it is 4, 8 or 16
// bytes, or several 16-byte pieces (double4, double8, float8).  16 bytes go by .cg (L2
// only: each tile is read once per work-group, so caching it in L1 would only evict);
// cp.async allows .ca alone for 4 and 8.  TILE_CP(local pointer, global pointer): the
// local address PTX wants is the shared-window address, the __local pointer's integer value.
#if TILE_VBYTES >= 16
#define TILE_CP_BYTES 16
#elif TILE_VBYTES == 8
#define TILE_CP_BYTES 8
#else
#define TILE_CP_BYTES 4
#endif
// (tests/test_kernels_source.py defines TILE_CP, TILE_CP_COMMIT, TILE_CP_WAIT and TILE_RING_STATE
// itself to run the ring on a CPU, each copy landing as early or as late as cp.async allows)
#ifndef TILE_CP
#if TILE_CP_BYTES == 16
#define TILE_CP(dst, src) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" \
                                       :: "r"((uint)(size_t)(dst)), "l"(src) : "memory")
#else
#define TILE_CP(dst, src) asm volatile("cp.async.ca.shared.global [%0], [%1], " TILE_STR(TILE_CP_BYTES) ";" \
                                       :: "r"((uint)(size_t)(dst)), "l"(src) : "memory")
#endif
#endif
#define TILE_CP_ELEMS (TILE_CP_BYTES * 8 / PRECISION)   // elements per cp.async
#define TILE_CP_PIECES (TILE_VBYTES / TILE_CP_BYTES)    // cp.async per global vector

// TILE_CP_WAIT(n): all but the n newest commit groups complete (n a constant expression;
// PTX takes the expression's text).
#ifndef TILE_CP_COMMIT
#define TILE_CP_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
#define TILE_CP_WAIT(n) asm volatile("cp.async.wait_group " TILE_STR(n) ";" ::: "memory")
#endif

// Issue tile t's copies into the local tiles As, Bs (this work-item's vectors, as TILE_SETUP
// assigns them).
#define TILE_COPY_ASYNC(t, As, Bs)                                              \
    do {                                                                        \
        const size_t oa = (size_t)(t) * stepA, ob = (size_t)(t) * stepB;        \
        _Pragma("unroll")                                                       \
        for (int l = 0; l < LPTA; l++) {                                        \
            _Pragma("unroll")                                                   \
            for (int p = 0; p < TILE_CP_PIECES; p++) {                          \
                const int e = la[l] + p * TILE_CP_ELEMS;                        \
                TILE_CP((As) + TILE_PLACE(e, LDAS),                             \
                        pa[l] + oa + p * TILE_CP_ELEMS);                        \
            }                                                                   \
        }                                                                       \
        _Pragma("unroll")                                                       \
        for (int l = 0; l < LPTB; l++) {                                        \
            _Pragma("unroll")                                                   \
            for (int p = 0; p < TILE_CP_PIECES; p++) {                          \
                const int e = lb[l] + p * TILE_CP_ELEMS;                        \
                TILE_CP((Bs) + TILE_PLACE(e, LDBS),                             \
                        pb[l] + ob + p * TILE_CP_ELEMS);                        \
            }                                                                   \
        }                                                                       \
    } while (0)

// The ring.  Commit group g holds tile g's copies (an empty group when g >= numTiles: the
// tail keeps committing so that the counts below stay right).  Tile t lives in stage t % STAGES.
// TILE_RING_LOOKAHEAD (L, 0 unless the kernel sets it) is how many tiles beyond t the kernel
// reads in iteration t (gemm_dmma.cl's FRAGPREFETCH: the next tile's first fragments).
//
// Invariant, at the top of iteration t: groups 0 .. t + STAGES - 2 are committed, so
// wait_group STAGES - 2 - L completes groups 0 .. t + L (this work-item's copies of tiles up to
// t + L); the barrier after it makes every work-item's copies of them visible and retires
// every read of tile t - 1 (iteration t - 1 read tiles t - 1 .. t - 1 + L, all before it).
// Tile t - 1's stage, (t - 1) % STAGES == (t + STAGES - 1) % STAGES, is then refilled with
// tile t + STAGES - 1; it is none of the stages of tiles t .. t + L read in iteration t as
// long as STAGES >= L + 2.  So STAGES - 1 - L tiles are in flight while tile t is computed,
// and there is one barrier per tile.
#ifndef TILE_RING_LOOKAHEAD
#define TILE_RING_LOOKAHEAD 0
#endif
#if STAGES < TILE_RING_LOOKAHEAD + 2
#error "the ring needs STAGES >= 2, and STAGES >= 3 to read the next tile ahead (FRAGPREFETCH)"
#endif
#define TILE_PENDING (STAGES - 2 - TILE_RING_LOOKAHEAD)

// (TILE_RING_STATE: where tests/test_kernels_source.py declares its emulation's per-work-item
// state, at kernel scope; nothing here)
#ifndef TILE_RING_STATE
#define TILE_RING_STATE
#endif
#define TILE_RING_START(Asub, Bsub, numTiles)                                   \
    TILE_RING_STATE                                                             \
    _Pragma("unroll")                                                           \
    for (int s_ = 0; s_ < STAGES - 1; s_++) {                                   \
        if (s_ < (numTiles)) {                                                  \
            TILE_COPY_ASYNC(s_, (Asub)[s_], (Bsub)[s_]);                        \
        }                                                                       \
        TILE_CP_COMMIT();                                                       \
    }                                                                           \
    int ring_ = 0   /* the stage of tile t */

// With L = 1: tile 0 landed and visible before the loop (its fragments are read ahead).
#define TILE_RING_FIRST()                                                       \
    do {                                                                        \
        TILE_CP_WAIT((STAGES - 2));                                             \
        barrier(CLK_LOCAL_MEM_FENCE);                                           \
    } while (0)

#define TILE_RING_REFILL(t, Asub, Bsub, numTiles)                               \
    do {                                                                        \
        TILE_CP_WAIT(TILE_PENDING);                                             \
        barrier(CLK_LOCAL_MEM_FENCE);                                           \
        const int free_ = ring_ == 0 ? STAGES - 1 : ring_ - 1;                  \
        if ((t) + STAGES - 1 < (numTiles)) {                                    \
            TILE_COPY_ASYNC((t) + STAGES - 1, (Asub)[free_], (Bsub)[free_]);    \
        }                                                                       \
        TILE_CP_COMMIT();                                                       \
    } while (0)

#define TILE_RING_STAGE ring_                                   // tile t's
#define TILE_RING_NEXT (ring_ + 1 == STAGES ? 0 : ring_ + 1)    // tile t + 1's
#define TILE_RING_ADVANCE() (ring_ = TILE_RING_NEXT)
#endif  // STAGES >= 2

// TILE_ORIGIN (the work-group's corner of C) is in common.cl: gemm_cpu.cl uses it too.

#endif  // DGEMM_TILE_LOADS_CL
