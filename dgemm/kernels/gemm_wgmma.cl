// Float32 GEMM on Hopper's warpgroup tensor-core instructions (wgmma, TF32),
// written in OpenCL C and finished by dgemm/opencl/ptx.py.
//
// NVIDIA's OpenCL builds for sm_90, where ptxas rejects wgmma (sm_90a only).
// So this file marks the places where Hopper-only instructions go with
// ordinary inline PTX that the sm_90 build accepts ("sites": an add of a
// site number to a dummy register, followed by one mov per register the
// instruction needs), and ptx.py replaces each site in the PTX the OpenCL
// compiler returns, retargets it to sm_90a and loads it back as a program
// binary.  Built as it is, on any other device or without the edits, the
// sites are no-ops and the kernel computes nothing useful: the host only
// launches the edited program.
//
// Contract ("NT"): C = alpha * A * BT^T + beta * C with A (M x K) and BT
// (N x K) both K-contiguous (wgmma reads TF32 operands K-major only), C
// (M x N) row-major; M, N, K multiples of BM, BN, BK (the host pads: seed
// kernel 10's zero padding).
//
// A work-group is WG warpgroups of 128 threads; warpgroup w computes rows
// 64w .. 64w+63 of the BM x BN tile (BM = 64 WG) with one wgmma.m64nBNk8
// per k-step of 8, its BN/2 accumulators per thread in registers.  Tiles of
// A and BT go global -> local memory by cp.async, STAGES deep (the seed's
// kernel 9 double buffer, deeper), while the tensor cores work on an older
// one.  Local memory holds them in one of wgmma's K-major layouts, described
// to the instruction by a 64-bit descriptor (start address, byte offsets
// between 8-row "core matrices", swizzle mode):
//   LAYOUT 2 (the default, 3x the others): the 128-byte swizzle: BK = 32, a
//     tile row is 128 bytes, chunk c of row r at chunk c ^ r%8, so the copies
//     of whole rows are coalesced and free of bank conflicts;
//   LAYOUT 0 / 1: no swizzle, 8-row x 16-byte core matrices stored
//     [k/4][row/8][row%8][k%4] (K-outer) or [row/8][k/4][row%8][k%4].
// STAGES 0 keeps the first version: two tiles, the next prefetched through
// registers.  The operands must already be TF32 values (rounded to nearest):
// the engine rounds them where it stages them (round_tf32, below); ROUND 1
// rounds in local memory instead (half the rate), and otherwise the tensor
// cores truncate.
// Local memory past the 48 KiB OpenCL reports builds and runs on this route
// (the sm_90a binary): 5 stages of 128 x 128 x 32 take 160 KiB.
#include "common.cl"

#if PRECISION != 32
#error "wgmma TF32 is float32 only"
#endif
#ifndef WG
#define WG 2                 // warpgroups per work-group
#endif
#ifndef BN
#define BN 128               // tile columns: the wgmma n (8..256, multiple of 8)
#endif
#ifndef BK
#define BK 32                // tile depth: a multiple of 8 (one wgmma per 8)
#endif
#ifndef LAYOUT
#define LAYOUT 2             // the 128-byte swizzle: 3x faster than 0 and 1 on the H100 (bench/NOTES.md)
#endif
#ifndef FIELDS
#define FIELDS 0             // 1 swaps the descriptor's two offset fields (a probe of the PTX ISA's wording)
#endif
#ifndef GROUPM
#define GROUPM 8             // tile rows walked together, so neighbouring work-groups share B panels in L2
#endif
#ifndef ROUND
#define ROUND 1              // 1: each thread rounds the values it copied to TF32 (cvt.rna) before the
#endif                       // tensor cores read them; 0: they truncate (cheaper, twice the error)
#ifndef SPLIT
#define SPLIT 0              // 1: 3xTF32 (float32 accuracy): A and BT arrive as [big; small] TF32 halves
#endif                       // (split_tf32), three wgmma per k-step, each tile summed with IEEE adds
#ifndef OVERLAP
#define OVERLAP 0            // SPLIT: 1 sums tile t into one of two register sets while tile t-1's
#endif                       // wgmma still run into the other (wait_group 1); 0 waits for each tile
#ifndef PROMOTE
#define PROMOTE 1            // SPLIT: tiles the tensor cores sum (wgmma's truncating accumulation) before one
#endif                       // IEEE add into acc: more hides the per-add wait, fewer keeps each truncated sum short
#ifndef FENCES
#define FENCES (OVERLAP ? 1 : 0)  // 0: one wgmma.fence per tile's set of wgmma; 1: one before every wgmma (4-9 %
#endif                       // slower on the H100).  The PTX ISA orders wgmma of one shape on the same accumulators
                             // without one.  (Fewer still, only where other instructions touched the accumulators,
                             // measured as fast as 0: ptxas adds its own there, C7519; bench/NOTES.md.)
#ifndef EARLY                // SPLIT: 1 readies tile t+1 (its copies' wait, the fence, the barrier, the next copies)
#if SPLIT && PROMOTE == 1 && !OVERLAP              // while tile t's wgmma run, so between one tile's wait and
#define EARLY 1              // the next tile's wgmma there is only the IEEE add (see the loop): +5-7 % on the H100
#else
#define EARLY 0
#endif
#endif
#ifndef STAGES
#define STAGES 5             // 0: two tiles, the next one prefetched through registers (seed kernel 9);
#endif                       // >= 3: STAGES tiles in flight, copied global -> local by cp.async

#define BM (64 * WG)
#define NT (128 * WG)
#define NACC (BN / 2)
#define KC (BK / 4)          // 16-byte core-matrix columns per tile row

#if BN % 8 || BN > 256 || BK % 8
#error "BN must be a multiple of 8 up to 256 and BK a multiple of 8"
#endif
#if (BM * KC) % NT || (BN * KC) % NT
#error "the tile loads need BM*BK/4 and BN*BK/4 to be multiples of the work-group size"
#endif
#if PROMOTE < 1 || (OVERLAP && PROMOTE != 1)
#error "PROMOTE is at least 1, and 1 with OVERLAP"
#endif
#if OVERLAP && FENCES != 1
#error "OVERLAP has its own sites, each with its fence: FENCES 1"
#endif
#if EARLY && (!SPLIT || OVERLAP || PROMOTE != 1)
#error "EARLY is a loop of SPLIT's alone, with PROMOTE 1 (no OVERLAP)"
#endif
#if FENCES < 0 || FENCES > 1
#error "FENCES is 0 or 1"
#endif
#if SPLIT
#define PARTS 2
#if STAGES == 0 || LAYOUT != 2
#error "SPLIT (3xTF32) needs the cp.async stages and the swizzled layout"
#endif
#else
#define PARTS 1
#endif
#define A_LOADS (BM * KC / NT)
#define B_LOADS (BN * KC / NT)

// Byte offset of the 16-byte vector (row r, k-column c) of a ROWS-row tile.
#if LAYOUT == 0
#define CORE_OFFSET(r, c, ROWS) ((c) * ((ROWS) * 16) + (r) * 16)
#define K_STRIDE(ROWS) ((ROWS) * 16)       // between core matrices along K
#define MN_STRIDE(ROWS) 128                // between core matrices along M or N
#elif LAYOUT == 1
#define CORE_OFFSET(r, c, ROWS) (((r) >> 3) * (KC * 128) + (c) * 128 + ((r) & 7) * 16)
#define K_STRIDE(ROWS) 128
#define MN_STRIDE(ROWS) (KC * 128)
#else
// LAYOUT 2, wgmma's 128-byte swizzle: each tile row is 128 bytes (BK = 32), 8 rows make a
// 1024-byte atom, and 16-byte chunk c of row r sits at chunk c ^ (r % 8).  A warp's copies of
// whole rows are then coalesced in global memory and free of bank conflicts in local memory.
#if BK != 32 || STAGES == 0
#error "LAYOUT 2 (128-byte swizzle) needs BK = 32 and cp.async (STAGES >= 3)"
#endif
#define CORE_OFFSET(r, c, ROWS) (((r) >> 3) * 1024 + ((r) & 7) * 128 + (((c) ^ ((r) & 7)) * 16))
#define K_STRIDE(ROWS) 16                  // (not used by the swizzled K-major layout)
#define MN_STRIDE(ROWS) 1024               // between 8-row atoms
#define SWIZZLE_BITS ((ulong)1 << 62)     // descriptor bits 62-63: 1 = 128-byte swizzle
#endif
#ifndef SWIZZLE_BITS
#define SWIZZLE_BITS ((ulong)0)
#endif
#if FIELDS == 0
#define LBO(ROWS) K_STRIDE(ROWS)
#define SBO(ROWS) MN_STRIDE(ROWS)
#else
#define LBO(ROWS) MN_STRIDE(ROWS)
#define SBO(ROWS) K_STRIDE(ROWS)
#endif

// Sites (dgemm.opencl.wgmma.sites() says what replaces each number, and why).
#define SITE(n) asm volatile("add.u32 %0, %0, " #n ";" : "+r"(site))
#define MARK64(x) asm volatile("mov.b64 %0, %0;" : "+l"(x))
// The registers the tensor cores accumulate into: acc, or with SPLIT one tile's sum (tacc), which
// IEEE adds then take into acc (the tensor cores' own accumulation truncates: its error would grow with K).
#if SPLIT
#define WACC tacc
#else
#define WACC acc
#endif
#define MARKACC() do { _Pragma("unroll") for (int i = 0; i < NACC; i++) asm volatile("mov.f32 %0, %0;" : "+f"(WACC[i])); } while (0)
#if FENCES == 1
// 7101: wgmma.fence + wgmma.mma_async m64nBNk8 f32.tf32.tf32, D += A B (descriptors, then the accumulators)
#define WGMMA(da, db) do { SITE(7101); MARK64(da); MARK64(db); MARKACC(); } while (0)
// 7106: the same with D = A B (the first of a tile's products: the accumulators start from zero)
#define WGMMA_FIRST(da, db) do { SITE(7106); MARK64(da); MARK64(db); MARKACC(); } while (0)
#define WGMMA_FENCE()
#else
// 7121, 7126: as 7101, 7106 without the fence; 7108, the fence, opens each tile's set
#define WGMMA(da, db) do { SITE(7121); MARK64(da); MARK64(db); MARKACC(); } while (0)
#define WGMMA_FIRST(da, db) do { SITE(7126); MARK64(da); MARK64(db); MARKACC(); } while (0)
#define WGMMA_FENCE() SITE(7108)
#endif
#define WGMMA_COMMIT() SITE(7102)                       // wgmma.commit_group
#define WGMMA_WAIT() do { SITE(7103); MARKACC(); } while (0)   // wgmma.wait_group 0 (the accumulators are read after it)
#define WGMMA_WAIT1() SITE(7105)                        // wgmma.wait_group 1: all but the newest group done
#define PROXY_FENCE() SITE(7104)                        // fence.proxy.async.shared::cta: local stores -> tensor cores

#if STAGES > 0
#if STAGES < 3
#error "STAGES is 0 (register prefetch) or at least 3 (cp.async)"
#endif
#define NSTAGE STAGES
#else
#define NSTAGE 2
#endif
#define STR_(x) #x
#define STR(x) STR_(x)
// cp.async (sm_80): 16 bytes global -> local without passing through registers; the
// local address is the shared-window address (an address-space-3 pointer as an integer).
#define CP_ASYNC(saddr, gptr) \
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(saddr), "l"(gptr) : "memory")
#define CP_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
// Tile t has landed when at most STAGES-3 newer groups are still in flight (see the loop).
#define CP_WAIT() asm volatile("cp.async.wait_group " STR(CP_PENDING) ";" ::: "memory")

inline ulong descriptor(const uint address, const uint lbo, const uint sbo)
{
    return (ulong)((address & 0x3FFFF) >> 4) | ((ulong)(lbo >> 4) << 16) | ((ulong)(sbo >> 4) << 32) | SWIZZLE_BITS;
}

inline float4 to_tf32(const float4 x)
{
    // Round to nearest (the tensor cores would truncate the low 13 bits).
    uint4 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r.x) : "f"(x.x));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r.y) : "f"(x.y));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r.z) : "f"(x.z));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r.w) : "f"(x.w));
    return as_float4(r);
}

__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void gemm_wgmma(const int M, const int N, const int K,
                const float alpha, const float beta,
                const __global float4* restrict A,
                const __global float4* restrict BT,
                __global float* C,
                __global uint* probe)
{
    __local float4 tiles[NSTAGE][PARTS * (BM + BN) * KC] __attribute__((aligned(1024)));   // (swizzle atoms: 1024)
    const int tid = get_local_id(0);
    const int wg = tid >> 7, lane = tid & 31, warp = (tid >> 5) & 3;
    uint site = 0;

    // Tile origin, walking GROUPM tile rows per column band (L2 reuse of BT panels).
    const int tilesM = M / BM, tilesN = N / BN;
    const int id = get_group_id(1) * get_num_groups(0) + get_group_id(0);
#if GROUPM > 0
    const int band = id / (GROUPM * tilesN);
    const int first = band * GROUPM;
    const int rows = min(tilesM - first, GROUPM);
    const int tm = first + (id % (GROUPM * tilesN)) % rows;
    const int tn = (id % (GROUPM * tilesN)) / rows;
#else
    const int tm = id / tilesN, tn = id % tilesN;
#endif
    const int m0 = tm * BM, n0 = tn * BN;
    const int kv = K / 4;    // float4s per row of A and BT

    // Thread -> (row, k-column) of its loads: rows fastest, so a warp's local stores are one
    // contiguous 512-byte run (no bank conflicts) in either layout's core matrices.
    float4 ra[A_LOADS], rb[B_LOADS];
#define LOAD_TILE(t)                                                            \
    _Pragma("unroll") for (int i = 0; i < A_LOADS; i++) {                        \
        const int e = tid + i * NT, r = e % BM, c = e / BM;                      \
        ra[i] = A[(m0 + r) * kv + (t) * KC + c];                                 \
    }                                                                            \
    _Pragma("unroll") for (int i = 0; i < B_LOADS; i++) {                        \
        const int e = tid + i * NT, r = e % BN, c = e / BN;                      \
        rb[i] = BT[(n0 + r) * kv + (t) * KC + c];                                \
    }
#define STORE_TILE(s)                                                           \
    _Pragma("unroll") for (int i = 0; i < A_LOADS; i++) {                        \
        const int e = tid + i * NT, r = e % BM, c = e / BM;                      \
        tiles[s][CORE_OFFSET(r, c, BM) / 16] = to_tf32(ra[i]);                   \
    }                                                                            \
    _Pragma("unroll") for (int i = 0; i < B_LOADS; i++) {                        \
        const int e = tid + i * NT, r = e % BN, c = e / BN;                      \
        tiles[s][BM * KC + CORE_OFFSET(r, c, BN) / 16] = to_tf32(rb[i]);         \
    }

    float acc[NACC];
    _Pragma("unroll") for (int i = 0; i < NACC; i++) acc[i] = 0.0f;
#if SPLIT && OVERLAP
    float tacc0[NACC], tacc1[NACC];
    _Pragma("unroll") for (int i = 0; i < NACC; i++) tacc0[i] = tacc1[i] = 0.0f;
#elif SPLIT
    float tacc[NACC];
    _Pragma("unroll") for (int i = 0; i < NACC; i++) tacc[i] = 0.0f;
#endif

    // Shared-window address of stage 0 (an address-space-3 pointer as an integer).
    const uint base = (uint)(size_t)&tiles[0][0];
#define PART_BYTES ((BM + BN) * KC * 16)
#define STAGE_BYTES (PARTS * PART_BYTES)
    if (probe != 0 && get_group_id(0) == 0 && get_group_id(1) == 0 && tid == 0) {
        probe[0] = base;
        probe[1] = base + STAGE_BYTES;
    }
    const int nt = K / BK;
#if SPLIT
    // 3xTF32: big*big + big*small + small*big (small*small is below float32's rounding).
#define ISSUE_SET(s, FIRST, NEXT)                                                          \
    {                                                                                      \
        WGMMA_FENCE();                                                                     \
        const uint a0 = base + (s) * STAGE_BYTES + wg * 64 * 16 * KC;                      \
        const uint b0 = base + (s) * STAGE_BYTES + BM * KC * 16;                           \
        _Pragma("unroll") for (int k8 = 0; k8 < BK / 8; k8++) {                           \
            ulong da = descriptor(a0 + CORE_OFFSET(0, 2 * k8, BM), LBO(BM), SBO(BM));      \
            ulong db = descriptor(b0 + CORE_OFFSET(0, 2 * k8, BN), LBO(BN), SBO(BN));      \
            ulong ds = descriptor(a0 + PART_BYTES + CORE_OFFSET(0, 2 * k8, BM), LBO(BM), SBO(BM)); \
            ulong dt = descriptor(b0 + PART_BYTES + CORE_OFFSET(0, 2 * k8, BN), LBO(BN), SBO(BN)); \
            if (k8 == 0) FIRST(da, db); else NEXT(da, db);                                 \
            NEXT(da, dt);                                                                  \
            NEXT(ds, db);                                                                  \
        }                                                                                  \
        WGMMA_COMMIT();                                                                    \
    }
#define ISSUE_WGMMA(s) ISSUE_SET(s, WGMMA_FIRST, WGMMA)
#if OVERLAP
    // Two register sets, each its own site numbers (ptx.py checks each set's registers stay put):
    // set 0 is 7101 / 7106 / 7103 / 7107, set 1 7111 / 7116 / 7113 / 7117.
#define MARKSET(arr) do { _Pragma("unroll") for (int i = 0; i < NACC; i++) asm volatile("mov.f32 %0, %0;" : "+f"(arr[i])); } while (0)
#define WG0(da, db) do { SITE(7101); MARK64(da); MARK64(db); MARKSET(tacc0); } while (0)
#define WG0F(da, db) do { SITE(7106); MARK64(da); MARK64(db); MARKSET(tacc0); } while (0)
#define WG1(da, db) do { SITE(7111); MARK64(da); MARK64(db); MARKSET(tacc1); } while (0)
#define WG1F(da, db) do { SITE(7116); MARK64(da); MARK64(db); MARKSET(tacc1); } while (0)
#endif
#else
#define ISSUE_WGMMA(s)                                                                     \
    {                                                                                      \
        WGMMA_FENCE();                                                                     \
        const uint a0 = base + (s) * STAGE_BYTES + wg * 64 * 16 * (LAYOUT == 0 ? 1 : KC);  \
        const uint b0 = base + (s) * STAGE_BYTES + BM * KC * 16;                           \
        _Pragma("unroll") for (int k8 = 0; k8 < BK / 8; k8++) {                           \
            /* one k8 step covers two core-matrix columns: 2*k8 and 2*k8+1 */              \
            ulong da = descriptor(a0 + CORE_OFFSET(0, 2 * k8, BM), LBO(BM), SBO(BM));      \
            ulong db = descriptor(b0 + CORE_OFFSET(0, 2 * k8, BN), LBO(BN), SBO(BN));      \
            WGMMA(da, db);                                                                 \
        }                                                                                  \
        WGMMA_COMMIT();                                                                    \
    }
#endif
#if STAGES == 0
    LOAD_TILE(0);
    STORE_TILE(0);
    PROXY_FENCE();
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int t = 0; t < nt; t++) {
        const int s = t & 1;
        if (t + 1 < nt) {
            LOAD_TILE(t + 1);
        }
        ISSUE_WGMMA(s);
        if (t + 1 < nt) {
            STORE_TILE(s ^ 1);
            PROXY_FENCE();
        }
        WGMMA_WAIT();
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#else
    // STAGES-deep ring: at iteration t the tensor cores read stage t % STAGES, one wgmma group
    // (tile t-1) may still be running, and the copies of the next LEAD-1 tiles are in flight.
    // The copies issued at t (after its barrier) go to the stage of tile t-2, which both warpgroups
    // finished reading before that barrier (each waited for all but its newest group): LEAD =
    // STAGES-2 tiles ahead.  (Refilling tile t-1's stage instead, behind a second barrier per tile,
    // was slower on the H100: bench/NOTES.md.)
#define LEAD (STAGES - 2)
#define CP_PENDING (LEAD - 1)
#if LAYOUT == 2
#define COPY_ROW(e, ROWS) ((e) / KC)     // chunks of a row fastest: coalesced, and the swizzle spreads the banks
#define COPY_COL(e, ROWS) ((e) % KC)
#else
#define COPY_ROW(e, ROWS) ((e) % (ROWS)) // rows fastest: one contiguous run of local memory per warp
#define COPY_COL(e, ROWS) ((e) / (ROWS))
#endif
    // (with SPLIT the small halves follow the big ones: rows M.. of A, N.. of BT)
#define COPY_TILE(t, s)                                                                      \
    _Pragma("unroll") for (int part = 0; part < PARTS; part++) {                             \
        const uint st = base + (s) * STAGE_BYTES + part * PART_BYTES;                        \
        _Pragma("unroll") for (int i = 0; i < A_LOADS; i++) {                                \
            const int e = tid + i * NT, r = COPY_ROW(e, BM), c = COPY_COL(e, BM);            \
            CP_ASYNC(st + CORE_OFFSET(r, c, BM),                                             \
                     A + (size_t)(part * M + m0 + r) * kv + (t) * KC + c);                   \
        }                                                                                    \
        _Pragma("unroll") for (int i = 0; i < B_LOADS; i++) {                                \
            const int e = tid + i * NT, r = COPY_ROW(e, BN), c = COPY_COL(e, BN);            \
            CP_ASYNC(st + BM * KC * 16 + CORE_OFFSET(r, c, BN),                              \
                     BT + (size_t)(part * N + n0 + r) * kv + (t) * KC + c);                  \
        }                                                                                    \
    }
    _Pragma("unroll") for (int t = 0; t < LEAD; t++) {
        if (t < nt) {
            COPY_TILE(t, t);
        }
        CP_COMMIT();
    }
#if ROUND
    // Round-to-nearest TF32 in place, each thread over the chunks it copied itself (those are the
    // copies its CP_WAIT covers), as gemm_dmma.cl's cvt.rna: the tf32 path's accuracy contract.
#define ROUND_TILE(s)                                                                        \
    {                                                                                        \
        __local float4* st = tiles[s];                                                       \
        _Pragma("unroll") for (int i = 0; i < A_LOADS; i++) {                                \
            const int e = tid + i * NT, r = COPY_ROW(e, BM), c = COPY_COL(e, BM);            \
            st[CORE_OFFSET(r, c, BM) / 16] = to_tf32(st[CORE_OFFSET(r, c, BM) / 16]);        \
        }                                                                                    \
        _Pragma("unroll") for (int i = 0; i < B_LOADS; i++) {                                \
            const int e = tid + i * NT, r = COPY_ROW(e, BN), c = COPY_COL(e, BN);            \
            const int o = BM * KC + CORE_OFFSET(r, c, BN) / 16;                              \
            st[o] = to_tf32(st[o]);                                                          \
        }                                                                                    \
    }
#else
#define ROUND_TILE(s)
#endif
    // Tile t in local memory for the tensor cores (this thread's copies landed, rounded if ROUND, made
    // visible to the async proxy, everyone's behind the barrier) and the copies of tile t + LEAD under
    // way.  Every iteration commits one group, empty or not, so CP_WAIT's count stays right.
#define TILE_START(t)                                                                        \
    {                                                                                        \
        CP_WAIT();                                                                           \
        ROUND_TILE((t) % STAGES);                                                            \
        PROXY_FENCE();                                                                       \
        barrier(CLK_LOCAL_MEM_FENCE);                                                        \
        const int next = (t) + LEAD;                                                         \
        if (next < nt) {                                                                     \
            COPY_TILE(next, next % STAGES);                                                  \
        }                                                                                    \
        CP_COMMIT();                                                                         \
    }
#if SPLIT && OVERLAP
    // Tiles in pairs: tile t sums into set 0 while tile t-1's wgmma (set 1) finish, then the
    // other way round.  A tile's stage is refilled two tiles later, after both warpgroups waited
    // for all but their newest group (as in the TF32 loop below).
    for (int t = 0; t < nt; t += 2) {
        TILE_START(t);
        ISSUE_SET(t % STAGES, WG0F, WG0);
        if (t > 0) {
            SITE(7117); MARKSET(tacc1);         // wait_group 1: tile t-1 (set 1) done
            _Pragma("unroll") for (int i = 0; i < NACC; i++) acc[i] += tacc1[i];
        }
        if (t + 1 < nt) {
            TILE_START(t + 1);
            ISSUE_SET((t + 1) % STAGES, WG1F, WG1);
            SITE(7107); MARKSET(tacc0);         // wait_group 1: tile t (set 0) done
            _Pragma("unroll") for (int i = 0; i < NACC; i++) acc[i] += tacc0[i];
        }
    }
    if (nt & 1) {   // the last tile's group is still running
        SITE(7103); MARKSET(tacc0);
        _Pragma("unroll") for (int i = 0; i < NACC; i++) acc[i] += tacc0[i];
    } else if (nt > 0) {
        SITE(7113); MARKSET(tacc1);
        _Pragma("unroll") for (int i = 0; i < NACC; i++) acc[i] += tacc1[i];
    }
#elif SPLIT && EARLY
    // Each tile summed from zero (7106) and added with IEEE adds after its own wait_group 0, as below with
    // PROMOTE 1; but the wait for tile t+1's copies, the fence, the barrier and the copies of tile t+1+LEAD
    // happen while tile t's wgmma run, so after the wait only the adds stand between two tiles' wgmma.
    // The copies go to the stage of tile t-1, which every warpgroup finished (its wait_group 0) before
    // the barrier.  No accumulator is touched between a wgmma and its wait (ptxas would serialize them).
    TILE_START(0);
    for (int t = 0; t < nt; t++) {
        ISSUE_SET(t % STAGES, WGMMA_FIRST, WGMMA);
        if (t + 1 < nt) {
            TILE_START(t + 1);
        }
        WGMMA_WAIT();
        _Pragma("unroll") for (int i = 0; i < NACC; i++) acc[i] += tacc[i];
    }
#elif SPLIT
    // PROMOTE tiles summed from zero by the tensor cores (7106 starts the sum), then one IEEE add.
    // Between the tiles of a sum, wait_group 1 as in the TF32 loop: the tensor cores never idle
    // there, and tile t-1's stage is free at the next barrier.  Only the add waits for all (7103).
    for (int t0 = 0; t0 < nt; t0 += PROMOTE) {
        TILE_START(t0);
        ISSUE_SET(t0 % STAGES, WGMMA_FIRST, WGMMA);
        WGMMA_WAIT1();
        _Pragma("unroll") for (int p = 1; p < PROMOTE; p++) {
            if (t0 + p < nt) {
                TILE_START(t0 + p);
                ISSUE_SET((t0 + p) % STAGES, WGMMA, WGMMA);
                WGMMA_WAIT1();
            }
        }
        WGMMA_WAIT();
        _Pragma("unroll") for (int i = 0; i < NACC; i++) acc[i] += tacc[i];
    }
#else
    for (int t = 0; t < nt; t++) {
        TILE_START(t);
        ISSUE_WGMMA(t % STAGES);
        WGMMA_WAIT1();      // tile t-1's wgmma done: its stage can be refilled after the next barrier
    }
    WGMMA_WAIT();
#endif
#endif

    // Accumulator i of lane 4g+q in warp w of the warpgroup: row 16w + g (+8 for i%4 >= 2),
    // column 8(i/4) + 2q + i%2 (the mma.m16n8 C layout, BN/8 times along N).
    const int g = lane >> 2, q = lane & 3;
    const int row = m0 + wg * 64 + warp * 16 + g;
    _Pragma("unroll") for (int j = 0; j < BN / 8; j++) {
        const int col = n0 + j * 8 + 2 * q;
        _Pragma("unroll") for (int h = 0; h < 2; h++) {
            __global float* c = C + (size_t)(row + 8 * h) * N + col;
            float2 v = (float2)(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]) * alpha;
            if (beta != 0.0f) v += beta * vload2(0, c);
            vstore2(v, 0, c);
        }
    }
}

// The operands rounded to TF32 (round to nearest, as gemm_dmma.cl's cvt.rna) once, where the engine
// stages them: a pass over the block instead of one per use of each tile (ROUND 1 halved the rate).
__kernel void round_tf32(__global float4* x, const int n4)
{
    const int i = get_global_id(0);
    if (i < n4) {
        x[i] = to_tf32(x[i]);
    }
}

// 3xTF32's operands: x becomes big = TF32(x) (to nearest) in place and small = TF32(x - big)
// n4 float4s further on (the buffer holds both halves: the small one starts where the big one ends).
__kernel void split_tf32(__global float4* x, const int n4)
{
    const int i = get_global_id(0);
    if (i < n4) {
        const float4 v = x[i];
        const float4 big = to_tf32(v);
        x[i] = big;
        x[n4 + i] = to_tf32(v - big);
    }
}
