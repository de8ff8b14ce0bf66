// Blosc's LZ4 streams decoded on the device (issue 28, item 1).
//
// The host (dgemm/opencl/blosc.py) parses each Blosc frame and hands over a
// table with one row per LZ4 stream: where its compressed bytes are in `src`
// and how many, where its output goes in `dst` and how many bytes it must
// produce.  Every row was checked against both buffers on the host; this
// kernel checks everything the stream itself says (lengths, offsets) against
// the row, so a hostile stream can neither read nor write outside its own
// row's bytes, and ends after at most one step per input byte (no hang).  A
// stream that breaks a rule sets its error code and stops; the host raises.
//
// The rules are LZ4's block format as lz4 1.10's LZ4_decompress_safe applies
// them to a full block (c-blosc's decoder), so a stream is refused exactly
// where c-blosc refuses it, with one exception: a match offset of 0, which
// the format calls invalid and lz4's decoder lets through (it writes bytes of
// its own choosing); here it is an error.
//
// Parameters (#ifndef, like the GEMM kernels'):
//   LZ4_WG  lanes per stream (the work-group size).  All lanes walk the
//           sequences together (the same loads, so the same decisions, and
//           no barrier to share them); literal and match bytes are copied
//           lane-parallel.  A match reads output bytes other lanes wrote, so
//           a barrier precedes a match whose source was written since the
//           last one.  1 (no barriers at all) suits a CPU device.
#ifndef LZ4_WG
#define LZ4_WG 32
#endif

// Error codes (the host's table of reasons, blosc.LZ4_ERRORS, follows these).
#define LZ4_OK 0
#define LZ4_E_EMPTY 1         // no compressed bytes at all
#define LZ4_E_LITLEN 2        // a literal length's extra bytes run past the input
#define LZ4_E_LITERALS 3      // the last literals do not end the input exactly, or overrun the output
#define LZ4_E_MATCHLEN 4      // a match length's extra bytes run into the last 5 input bytes
#define LZ4_E_OFFSET_ZERO 5   // match offset 0
#define LZ4_E_BEFORE 6        // a match starts before the output's start
#define LZ4_E_MATCH_END 7     // a match ends in the last 5 output bytes (or past them)
#define LZ4_E_SIZE 8          // the stream ended short of its output length

// Lanes copy n bytes from in to out (distinct buffers or disjoint ranges).
#define LANE_COPY(out, in, n)                                  \
    for (long i_ = lane; i_ < (long)(n); i_ += LZ4_WG) {       \
        (out)[i_] = (in)[i_];                                  \
    }

// A length's extra bytes (255 means another follows) added to *length; reading
// stops with an error once *ip passes `limit` (lz4's read_variable_length).
static int more_length(const __global uchar* in, long* ip, const long limit, const int check_first,
                       long* length)
{
    if (check_first && *ip >= limit) return 1;
    uint b;
    do {
        b = in[(*ip)++];
        *length += b;
        if (*ip > limit) return 1;
    } while (b == 255);
    return 0;
}

// table: 4 ulongs per stream: src offset, dst offset, src length, dst length.
// A row whose two lengths are equal holds its bytes uncompressed (Blosc's rule).
// Global size: (streams * LZ4_WG), local (LZ4_WG).
// One exit and no break around the barrier: every lane runs the same
// iterations, which is all OpenCL asks, but PoCL's barrier handling is
// happiest with plain structured loops.
__kernel __attribute__((reqd_work_group_size(LZ4_WG, 1, 1)))
void lz4_streams(const __global uchar* restrict src,
                 __global uchar* restrict dst,
                 const __global ulong* restrict table,
                 __global int* restrict errors)
{
    const size_t s = get_group_id(0);
    const long lane = get_local_id(0);
    const __global uchar* in = src + table[4 * s];
    __global uchar* out = dst + table[4 * s + 1];
    const long n_in = (long)table[4 * s + 2];
    const long n_out = (long)table[4 * s + 3];
    const int stored = (n_in == n_out);

    int err = (!stored && n_in == 0) ? LZ4_E_EMPTY : LZ4_OK;
    int last = stored;
    if (stored) {
        LANE_COPY(out, in, n_out);
    }
    long ip = 0, op = stored ? n_out : 0;
    long synced = 0;     // output bytes before this are visible to every lane
    // Invariant at the top: ip < n_in (a sequence that does not end the stream
    // leaves at least 5 input bytes after it), so the token is there.
    while (err == LZ4_OK && !last) {
        const uint token = in[ip++];
        long lit = token >> 4;
        if (lit == 15 && more_length(in, &ip, n_in - 15, 1, &lit)) err = LZ4_E_LITLEN;
        const long lit_end = op + lit;
        if (err == LZ4_OK && (lit_end > n_out - 12 || ip + lit > n_in - 8)) {
            // the last sequence: literals only, ending the input exactly
            if (ip + lit != n_in || lit_end > n_out) err = LZ4_E_LITERALS;
            else last = 1;
        }
        if (err == LZ4_OK) {
            LANE_COPY(out + op, in + ip, lit);
            ip += lit;
            op = lit_end;
        }
        long offset = 1, len = 0;
        if (err == LZ4_OK && !last) {
            offset = (long)in[ip] | ((long)in[ip + 1] << 8);   // ip + 2 <= n_in - 6
            ip += 2;
            len = token & 15;
            if (len == 15 && more_length(in, &ip, n_in - 4, 0, &len)) err = LZ4_E_MATCHLEN;
            len += 4;
            if (err == LZ4_OK && offset == 0) err = LZ4_E_OFFSET_ZERO;
            if (err == LZ4_OK && offset > op) err = LZ4_E_BEFORE;
            if (err == LZ4_OK && op + len > n_out - 5) err = LZ4_E_MATCH_END;
            if (err != LZ4_OK) len = 0;
        }
#if LZ4_WG > 1
        // The match reads out[op - offset, op - offset + min(len, offset)) (an
        // overlapping match repeats its first `offset` bytes, so it never reads
        // its own bytes).  Every lane holds the same values: a uniform branch.
        if (len > 0 && op - offset + min(len, offset) > synced) {
            barrier(CLK_GLOBAL_MEM_FENCE);
            synced = op;
        }
#endif
        for (long i = lane; i < len; i += LZ4_WG) {
            out[op + i] = out[op - offset + (i % offset)];
        }
        op += len;
    }
    if (err == LZ4_OK && op != n_out) err = LZ4_E_SIZE;
    if (lane == 0) errors[s] = err;
}

// Unshuffle of Blosc blocks, from the planes the LZ4 streams were decoded to.
// jobs: 4 ulongs per block: byte offset (the same in src and dst), size, typesize, mode.
// mode 1, byte shuffle: a block of `size` bytes of `typesize`-byte elements was
//   stored as typesize byte planes of size / typesize bytes each, the
//   size % typesize bytes that make no whole element left at the end.
// mode 2, bit shuffle (c-blosc's bitshuffle): when the block's whole elements
//   number n, a multiple of 8, bit k of byte j of element e was stored at bit
//   e % 8 of byte e / 8 of bit row 8 j + k (rows of n / 8 bytes); the bytes
//   after the whole elements stay as they are.  Other counts are stored as they are.
// Global size: (any, blocks); each work-item strides over its block.
__kernel void unshuffle_blocks(const __global uchar* restrict src,
                               __global uchar* restrict dst,
                               const __global ulong* restrict jobs)
{
    const size_t b = get_global_id(1);
    const ulong off = jobs[4 * b];
    // within a block, 32-bit arithmetic (blocks are under 2^31 bytes): a GPU's 64-bit division is slow
    const uint size = (uint)jobs[4 * b + 1];
    const uint ts = (uint)jobs[4 * b + 2];
    const uint mode = (uint)jobs[4 * b + 3];
    const uint n = size / ts;           // whole elements = bytes per byte plane
    const uint shuffled = (mode == 2 && n % 8 != 0) ? 0 : n * ts;
    const __global uchar* in = src + off;
    for (uint p = get_global_id(0); p < size; p += get_global_size(0)) {
        uchar v;
        if (p >= shuffled) {
            v = in[p];
        } else {
            const uint e = p / ts;
            const uint j = p - e * ts;
            if (mode == 1) {
                v = in[j * n + e];
            } else {
                const __global uchar* rows = in + (8 * j) * (n / 8) + e / 8;
                const uint bit = e % 8;
                v = 0;
                for (uint k = 0; k < 8; k++) {
                    v |= ((rows[k * (n / 8)] >> bit) & 1) << k;
                }
            }
        }
        dst[off + p] = v;
    }
}
