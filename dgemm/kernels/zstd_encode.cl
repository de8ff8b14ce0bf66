// zstd literal-only blocks encoded on the device (issue 28, item 3).
//
// A region of a device buffer becomes a zstd frame whose blocks hold only
// Huffman-coded literals (RFC 8878: a Compressed_Literals_Block or a
// Treeless_Literals_Block, then 0 sequences), or raw or RLE blocks.  The
// host (dgemm/opencl/codecs/zstd_encode.py) cuts each 128 KiB block into its
// literal streams (4, or 1 below 256 bytes) and makes one row per stream:
// (source offset, literal count, region, destination offset), ulongs.  Then:
//
//   zstd_histogram      one work-group per stream: its 256 byte counts, and
//                       the region's counts summed (atomically) beside them;
//   zstd_stream_bits    one work-item per stream: its Huffman bits under the
//                       region's table, its distinct bytes and one of them
//                       (a block of one repeated byte becomes an RLE block);
//   zstd_encode_streams one work-group per stream of a compressed block:
//                       the stream written at its final offset in the frame;
//   copy_rows           the host's bytes (frame, block and literals headers,
//                       Huffman tree descriptions, jump tables) and raw blocks
//                       copied to their places.
//
// Huffman streams are read backwards (RFC 8878 4.2.2): a stream's first
// literal's code sits just below the stream's last 1 bit, the last literal's
// at bit 0.  Each lane of zstd_encode_streams takes a run of consecutive
// literals; a scan of the runs' bit counts gives each run its bit range, and
// the lanes write their codes into the stream's words in local memory (the
// words a run shares with its neighbours by atomic_or), so that the stream
// goes out to global memory in whole words, byte stores only at its two ends,
// whose other bytes belong to other pieces of the frame.
//
// Parameters (#ifndef, like the GEMM kernels'):
//   ZE_WG           work-items per work-group (every kernel but zstd_stream_bits).
//   ZE_STREAM_WORDS 32-bit words of local memory for one encoded stream: its
//                   bits, the marker bit and up to 3 bytes of alignment.  The host
//                   keeps any block with a longer stream raw.
//   ZE_HIST_COPIES  sub-histograms per work-group in zstd_histogram: lanes spread
//                   over them so that a few byte values (float exponents) do not
//                   serialise a warp's lanes on one counter.
#ifndef ZE_WG
#define ZE_WG 256
#endif
#ifndef ZE_STREAM_WORDS
#define ZE_STREAM_WORDS 8200
#endif
#ifndef ZE_HIST_COPIES
#define ZE_HIST_COPIES 8
#endif

// Error codes of zstd_encode_streams (the host's table of reasons follows these).
#define ZE_OK 0
#define ZE_E_BITS 1        // the stream's bits differ from what zstd_stream_bits counted
#define ZE_E_CAPACITY 2    // the stream does not fit ZE_STREAM_WORDS

#define ROW 4              // ulongs per stream row: source offset, literals, region, destination offset

__kernel __attribute__((reqd_work_group_size(ZE_WG, 1, 1)))
void zstd_histogram(const __global uchar* src, const __global ulong* rows, __global uint* hists,
                    __global uint* region_hists)
{
    __local uint h[ZE_HIST_COPIES * 256];
    const uint lid = get_local_id(0);
    const size_t row = get_group_id(0);
    for (uint i = lid; i < ZE_HIST_COPIES * 256; i += ZE_WG) h[i] = 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    const __global uchar* in = src + rows[ROW * row];
    const ulong n = rows[ROW * row + 1];
    // lanes 4k..4k+3 read one float32's bytes: its exponent byte's lanes (3, 7, 11...) spread over the
    // copies, rather than all on one as lid % ZE_HIST_COPIES would put them
    __local uint* mine = h + ((lid >> 2) % ZE_HIST_COPIES) * 256;
    for (ulong i = lid; i < n; i += ZE_WG) atomic_inc(&mine[in[i]]);
    barrier(CLK_LOCAL_MEM_FENCE);
    __global uint* region = region_hists + 256 * rows[ROW * row + 2];
    for (uint s = lid; s < 256; s += ZE_WG) {
        uint c = 0;
        for (uint k = 0; k < ZE_HIST_COPIES; k++) c += h[k * 256 + s];
        hists[256 * row + s] = c;
        if (c) atomic_add(&region[s], c);
    }
}

// codes: per region, 256 words of code | length << 16 (length 0: the byte is absent from the region).
// out: per stream, its bits, its distinct bytes, and the largest of them.
__kernel void zstd_stream_bits(const __global uint* hists, const __global ulong* rows, const __global uint* codes,
                               __global uint* out, const uint nrows)
{
    const size_t row = get_global_id(0);
    if (row >= nrows) return;
    const __global uint* code = codes + 256 * rows[ROW * row + 2];
    const __global uint* h = hists + 256 * row;
    uint bits = 0, distinct = 0, symbol = 0;
    for (uint s = 0; s < 256; s++) {
        const uint c = h[s];
        if (c) {
            bits += c * (code[s] >> 16);
            distinct++;
            symbol = s;
        }
    }
    out[3 * row] = bits;
    out[3 * row + 1] = distinct;
    out[3 * row + 2] = symbol;
}

// The code lengths of a word's 4 bytes, summed.
#define BITS4(x) ((table[(x) & 255] >> 16) + (table[((x) >> 8) & 255] >> 16) + \
                  (table[((x) >> 16) & 255] >> 16) + (table[(x) >> 24] >> 16))

// One literal's code appended above the bits so far; a full word goes to local memory.  Only a
// run's lowest and highest words can be shared with its neighbours: the lowest (the first one
// written) and the last partial one are ORed in atomically, every other one is the run's own.
#define PUT(byte)                                                      \
    do {                                                               \
        const uint c_ = table[(byte)];                                 \
        acc |= (ulong)(c_ & 0xFFFF) << nacc;                           \
        nacc += c_ >> 16;                                              \
        if (nacc >= 32) {                                              \
            if (first) atomic_or(&words[w], (uint)acc);                \
            else words[w] = (uint)acc;                                 \
            first = false;                                             \
            w++;                                                       \
            acc >>= 32;                                                \
            nacc -= 32;                                                \
        }                                                              \
    } while (0)
// a word's 4 literals, the last (highest byte) first: streams are written from their end
#define PUT4(x) do { PUT((x) >> 24); PUT(((x) >> 16) & 255); PUT(((x) >> 8) & 255); PUT((x) & 255); } while (0)

// bits: each stream's bit count from zstd_stream_bits, which the host laid the frame out by.
__kernel __attribute__((reqd_work_group_size(ZE_WG, 1, 1)))
void zstd_encode_streams(const __global uchar* src, const __global ulong* rows, const __global uint* codes,
                         const __global uint* bits, __global uchar* dst, __global uint* errors)
{
    __local uint table[256];
    __local uint scan[ZE_WG];
    __local uint words[ZE_STREAM_WORDS];
    const uint lid = get_local_id(0);
    const size_t row = get_group_id(0);
    const __global uchar* in = src + rows[ROW * row];
    const uint n = (uint)rows[ROW * row + 1];
    const __global uint* code = codes + 256 * rows[ROW * row + 2];
    const ulong d0 = rows[ROW * row + 3];
    const uint expected = bits[row];
    const uint shift = (uint)(d0 & 3) * 8;                  // the stream's bit 0 within its first word
    const uint nwords = (shift + expected + 1 + 31) / 32;   // its bits and the marker bit
    // an error is the same for every lane, which all still meet every barrier
    const uint fits = nwords <= ZE_STREAM_WORDS;
    for (uint i = lid; i < 256; i += ZE_WG) table[i] = code[i];
    for (uint i = lid; i < (fits ? nwords : 0); i += ZE_WG) words[i] = 0;
    // Lanes take the runs in reverse order (lane 0 the last run, at the stream's lowest bits).  On a
    // GPU that changes nothing; on a CPU device, where work-items run one after another in lane
    // order, a run's lowest word, shared with the run below, is written after that run's highest
    // word, so that a plain store where atomic_or is needed loses bits in the tests too.
    const uint r = ZE_WG - 1 - lid;
    // runs of a multiple of 16 literals: a run that starts 16-byte aligned is read in uint4 loads
    const uint per = ((n + ZE_WG - 1) / ZE_WG + 15) & ~15u;
    const uint i0 = min(r * per, n), i1 = min(i0 + per, n);
    const uint nvec = ((size_t)(in + i0) & 15) == 0 ? (i1 - i0) / 16 : 0;
    const uint iv = i0 + 16 * nvec;                       // bytes from here on are read one by one
    const __global uint4* vin = (const __global uint4*)(in + i0);
    barrier(CLK_LOCAL_MEM_FENCE);
    uint mine = 0;
    for (uint q = 0; q < nvec; q++) {
        const uint4 v = vin[q];
        mine += BITS4(v.x) + BITS4(v.y) + BITS4(v.z) + BITS4(v.w);
    }
    for (uint i = iv; i < i1; i++) mine += table[in[i]] >> 16;
    // inclusive scan of the runs' bits, in run order (Hillis-Steele)
    scan[r] = mine;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint off = 1; off < ZE_WG; off <<= 1) {
        const uint v = r >= off ? scan[r - off] : 0;
        barrier(CLK_LOCAL_MEM_FENCE);
        scan[r] += v;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const uint total = scan[ZE_WG - 1];
    const uint err = !fits ? ZE_E_CAPACITY : total != expected ? ZE_E_BITS : ZE_OK;
    if (err == ZE_OK) {
        // this run's first literal ends just below the bits of the runs before it (read first)
        const uint pos = shift + total - scan[r];
        ulong acc = 0;
        uint nacc = pos & 31, w = pos >> 5;
        bool first = true;
        for (uint i = i1; i-- > iv;) PUT(in[i]);
        for (uint q = nvec; q-- > 0;) {
            const uint4 v = vin[q];
            PUT4(v.w);
            PUT4(v.z);
            PUT4(v.y);
            PUT4(v.x);
        }
        if (nacc) atomic_or(&words[w], (uint)acc);      // (an empty run ORs nothing)
        if (lid == 0) atomic_or(&words[(shift + total) >> 5], 1u << ((shift + total) & 31));
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (err == ZE_OK) {
        // out: bytes [b0, b1) of the local words are the stream's
        const uint b0 = shift / 8, b1 = b0 + total / 8 + 1;
        __global uchar* base = dst + (d0 - b0);                 // 4-byte aligned
        for (uint j = lid; j < nwords; j += ZE_WG) {
            const uint lo = 4 * j;
            if (lo >= b0 && lo + 4 <= b1) {
                ((__global uint*)base)[j] = words[j];
            } else {
                for (uint k = max(lo, b0); k < min(lo + 4, b1); k++) base[k] = (uchar)(words[j] >> (8 * (k - lo)));
            }
        }
    }
    if (lid == 0) errors[row] = err;
}

// rows: (source offset, destination offset, bytes), ulongs; one work-group per row.
__kernel __attribute__((reqd_work_group_size(ZE_WG, 1, 1)))
void copy_rows(const __global uchar* src, __global uchar* dst, const __global ulong* rows)
{
    const size_t row = get_group_id(0);
    const __global uchar* in = src + rows[3 * row];
    __global uchar* out = dst + rows[3 * row + 1];
    const ulong n = rows[3 * row + 2];
    for (ulong i = get_local_id(0); i < n; i += ZE_WG) out[i] = in[i];
}
