// zstd decoding (RFC 8878) from the tables dgemm.opencl.codecs.zstd_frames makes on the host.
//
// Three kernels, run in this order on one queue:
//   zstd_huf_streams: one work-item per Huffman literal stream (all streams of all blocks of all
//                     frames at once, a work-group per block sharing its table in local memory)
//                     decodes its literals into the literal buffer;
//   zstd_sequences:   one work-item per compressed block with sequences decodes its FSE bitstream
//                     into (literal length, match length, offset code) rows;
//   zstd_copy_blocks: one work-group per block whose output position the host knows (raw, RLE and
//                     sequence-free blocks before a frame's first block with sequences) copies it;
//   zstd_execute:     one work-group per frame walks its blocks in order, resolves repeat offsets
//                     (they carry from block to block) and copies literals and matches into the
//                     output, the group's lanes sharing each copy.
// Every read is bounded by its stream, every write by its frame's output; what is wrong goes to
// an error row that the host turns into a message.  Bitstreams are read strictly: a stream must
// end exactly where its last symbol or sequence does, and no bit before its start is ever read.

#ifndef ZSTD_HUF_LANES
#define ZSTD_HUF_LANES 4  // work-items per block in zstd_huf_streams (they load its table; 1 or 4 decode)
#endif

#ifndef ZSTD_LANES
#define ZSTD_LANES 1      // work-items per frame in zstd_execute: a warp on a GPU, 1 (no barriers) on a CPU
#endif

// Column numbers of the host's rows (zstd_frames.py).
#define B_TYPE 0
#define B_SRC 2
#define B_SIZE 3
#define B_LITKIND 4
#define B_LITOFF 5
#define B_LITLEN 6
#define B_LIMIT 7
#define B_NSEQ 8
#define B_SEQ 9
#define B_SSRC 10
#define B_SLEN 11
#define B_LL 12
#define B_OF 13
#define B_ML 14
#define B_LOGS 15
#define B_INDEX 16
#define B_PRE 17
#define BLOCK_COLUMNS 18
#define STREAM_COLUMNS 8
#define FRAME_COLUMNS 6

#define RAW 0
#define RLE 1
#define LIT_HUF 0
#define LIT_SRC 1
#define LIMIT_REMAINING 0
#define BLOCK_MAX 131072L
#define LIT_EXTRA 65536L

// Error codes (zstd_decode.py has their messages).
#define E_OVERREAD 1          // a bitstream ran out before its last symbol or sequence
#define E_LEFTOVER 2          // bits left in a bitstream after its last symbol or sequence
#define E_RAW_PAST 11
#define E_RLE_PAST 12
#define E_LIT_SIZE 13
#define E_LIT_PAST 14
#define E_SEQ_PAST 15
#define E_OFFSET 16
#define E_LAST_PAST 17
#define E_SIZE 18
#define E_CHECKSUM 19

// A backward bitstream (RFC 8878 4.1): bits are read from the end of the stream towards its start.
// acc holds the stream's bits [top - 64, top), bytes before the stream's start read as 0.
typedef struct {
    global const uchar* s;
    ulong acc;
    long top;
    long pos;             // bits not yet read: the next read takes bits [pos - n, pos)
} bits_t;

inline void bits_fill(bits_t* b, long pos) {
    long end = (pos + 7) >> 3;
    ulong acc = 0;
#ifdef __ENDIAN_LITTLE__
    if (end >= 8) {
        acc = as_ulong(vload8(0, b->s + end - 8));
    } else
#endif
    {
        for (int k = 0; k < 8; k++) {
            long at = end - 8 + k;
            if (at >= 0) acc |= (ulong)b->s[at] << (8 * k);
        }
    }
    b->acc = acc;
    b->top = end * 8;
}

// The n bits (n <= 32) ending at position at (bits below 0 read as 0), without moving.
inline uint bits_peek(bits_t* b, long at, int n) {
    if (n == 0) return 0;
    if (at - n < b->top - 64 || at > b->top) bits_fill(b, at);
    long shift = at - n - (b->top - 64);
    return (uint)((b->acc >> shift) & ((1UL << n) - 1));
}

inline void bits_init(bits_t* b, global const uchar* s, long n) {
    b->s = s;
    uchar last = s[n - 1];      // not 0: the host checked
    b->pos = 8 * (n - 1) + (31 - clz((uint)last));
    bits_fill(b, b->pos);
}

inline uint huf_log2(uint v) { return 31 - clz(v); }

// One Huffman stream's literals; the lookup table is in local memory (its latency is each symbol's).
int huf_stream(global const uchar* src, global const long* row, local const ushort* table, global uchar* lit) {
    long n = row[1], dlen = row[3];
    int log = (int)row[5];
    global uchar* out = lit + row[2];
    bits_t b;
    bits_init(&b, src + row[0], n);
    for (long i = 0; i < dlen; i++) {
        ushort e = table[bits_peek(&b, b.pos, log)];
        int len = e >> 8;
        if (len > b.pos) return E_OVERREAD;
        b.pos -= len;
        out[i] = (uchar)e;
    }
    return b.pos != 0 ? E_LEFTOVER : 0;
}

// One work-group per block with Huffman literals (groups: its first stream row, its stream count): the
// group loads the block's table into local memory, then one work-item per stream (1 or 4) decodes.
kernel __attribute__((reqd_work_group_size(ZSTD_HUF_LANES, 1, 1)))
void zstd_huf_streams(global const uchar* src, global const long* streams, global const long* groups,
                      global const ushort* huf, global uchar* lit, global int* err) {
    local ushort table[4096];
    const int lane = get_local_id(0);
    const long first = groups[2 * get_group_id(0)], count = groups[2 * get_group_id(0) + 1];
    global const long* row = streams + (first + min((long)lane, count - 1)) * STREAM_COLUMNS;
    global const ushort* t = huf + row[4];
    const int size = 1 << (int)row[5];
    for (int k = lane; k < size; k += ZSTD_HUF_LANES) table[k] = t[k];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lane < count) err[first + lane] = huf_stream(src, row, table, lit);
}

kernel void zstd_sequences(global const uchar* src, global const long* blocks, global const long* which,
                           global const uint2* fse, global uint4* seqs, global int* err, uint count) {
    uint g = get_global_id(0);
    if (g >= count) return;
    global const long* row = blocks + which[g] * BLOCK_COLUMNS;
    long nseq = row[B_NSEQ];
    global uint4* out = seqs + row[B_SEQ];
    global const uint2* llt = fse + row[B_LL];
    global const uint2* oft = fse + row[B_OF];
    global const uint2* mlt = fse + row[B_ML];
    int logs = (int)row[B_LOGS];
    int lllog = logs & 0xFF, oflog = (logs >> 8) & 0xFF, mllog = (logs >> 16) & 0xFF;
    bits_t b;
    bits_init(&b, src + row[B_SSRC], row[B_SLEN]);
    int code = 0;
#define READ(v, nb) do { int n_ = (nb); if (n_ > b.pos) { code = E_OVERREAD; goto done; } \
                         v = bits_peek(&b, b.pos, n_); b.pos -= n_; } while (0)
    uint ll_s, of_s, ml_s, v;
    READ(ll_s, lllog);
    READ(of_s, oflog);
    READ(ml_s, mllog);
    for (long i = 0; i < nseq; i++) {
        uint2 lle = llt[ll_s], ofe = oft[of_s], mle = mlt[ml_s];
        int ofbits = ofe.y >> 24, mlbits = mle.y >> 24, llbits = lle.y >> 24;
        uint ll0 = lle.x == 0;
        uint4 s;
        if (ofbits > 1) {                 // a new offset
            READ(v, ofbits);
            s.z = ofe.x + v;
            s.w = 0;
        } else if (ofbits == 0) {         // repeat offset 1 (2 after no literals)
            s.z = ll0;
            s.w = 1;
        } else {                          // repeat offset 2 or 3 (3 or offset 1 - 1 after no literals)
            READ(v, 1);
            s.z = ofe.x + ll0 + v;
            s.w = 2;
        }
        READ(v, mlbits);
        s.y = mle.x + v;
        READ(v, llbits);
        s.x = lle.x + v;
        out[i] = s;
        if (i + 1 < nseq) {               // no state update after the last sequence
            READ(v, (lle.y >> 16) & 0xFF);
            ll_s = (lle.y & 0xFFFF) + v;
            READ(v, (mle.y >> 16) & 0xFF);
            ml_s = (mle.y & 0xFFFF) + v;
            READ(v, (ofe.y >> 16) & 0xFF);
            of_s = (ofe.y & 0xFFFF) + v;
        }
    }
    if (b.pos != 0) code = E_LEFTOVER;
done:
#undef READ
    err[g] = code;
}

// ---- XXH64 (the frame checksum keeps its low 32 bits) ----
#define P1 11400714785074694791UL
#define P2 14029467366897019727UL
#define P3 1609587929392839161UL
#define P4 9650029242287828579UL
#define P5 2870177450012600261UL

inline ulong xxh_round(ulong acc, ulong in) { acc += in * P2; acc = rotate(acc, 31UL); return acc * P1; }
inline ulong xxh_merge(ulong h, ulong v) { h ^= xxh_round(0, v); return h * P1 + P4; }
inline ulong rd64(global const uchar* p) {
#ifdef __ENDIAN_LITTLE__
    return as_ulong(vload8(0, p));
#else
    ulong v = 0;
    for (int k = 0; k < 8; k++) v |= (ulong)p[k] << (8 * k);
    return v;
#endif
}

ulong xxh64(global const uchar* p, long len) {
    long i = 0;
    ulong h;
    if (len >= 32) {
        ulong v1 = P1 + P2, v2 = P2, v3 = 0, v4 = 0 - P1;
        for (; i + 32 <= len; i += 32) {
            v1 = xxh_round(v1, rd64(p + i));
            v2 = xxh_round(v2, rd64(p + i + 8));
            v3 = xxh_round(v3, rd64(p + i + 16));
            v4 = xxh_round(v4, rd64(p + i + 24));
        }
        h = rotate(v1, 1UL) + rotate(v2, 7UL) + rotate(v3, 12UL) + rotate(v4, 18UL);
        h = xxh_merge(h, v1); h = xxh_merge(h, v2); h = xxh_merge(h, v3); h = xxh_merge(h, v4);
    } else {
        h = P5;
    }
    h += (ulong)len;
    for (; i + 8 <= len; i += 8) {
        h ^= xxh_round(0, rd64(p + i));
        h = rotate(h, 27UL) * P1 + P4;
    }
    if (i + 4 <= len) {
        ulong w = (ulong)p[i] | ((ulong)p[i + 1] << 8) | ((ulong)p[i + 2] << 16) | ((ulong)p[i + 3] << 24);
        h ^= w * P1;
        h = rotate(h, 23UL) * P2 + P3;
        i += 4;
    }
    for (; i < len; i++) {
        h ^= (ulong)p[i] * P5;
        h = rotate(h, 11UL) * P1;
    }
    h ^= h >> 33; h *= P2; h ^= h >> 29; h *= P3; h ^= h >> 32;
    return h;
}

#if ZSTD_LANES > 1
#define SYNC() barrier(CLK_GLOBAL_MEM_FENCE)
#else
#define SYNC()
#endif

// A copy shared by the group's lanes, 16 bytes per lane per step (source and destination do not overlap).
inline void group_copy(global uchar* d, global const uchar* s, long n, int lane) {
    long k = (long)lane * 16;
    for (; k + 16 <= n; k += 16 * ZSTD_LANES) vstore16(vload16(0, s + k), 0, d + k);
    for (long t = (n & ~15L) + lane; t < n; t += ZSTD_LANES) d[t] = s[t];
}

inline void group_fill(global uchar* d, uchar c, long n, int lane) {
    long k = (long)lane * 16;
    for (; k + 16 <= n; k += 16 * ZSTD_LANES) vstore16((uchar16)c, 0, d + k);
    for (long t = (n & ~15L) + lane; t < n; t += ZSTD_LANES) d[t] = c;
}

// One work-group per block of which[]: its literals, raw bytes or RLE byte at the position the host
// found (B_PRE).  A block that would reach past its frame's output writes nothing (zstd_execute reports it).
kernel __attribute__((reqd_work_group_size(ZSTD_LANES, 1, 1)))
void zstd_copy_blocks(global const uchar* src, global const long* blocks, global const long* which,
                      global const long* frames, global const uchar* lit, global uchar* out) {
    const int lane = get_local_id(0);
    global const long* row = blocks + which[get_group_id(0)] * BLOCK_COLUMNS;
    global const long* fr = frames + row[1] * FRAME_COLUMNS;
    const long type = row[B_TYPE], at = row[B_PRE];
    const long n = type == 2 ? row[B_LITLEN] : row[B_SIZE];
    if (at < 0 || n > fr[1] - at) return;
    global uchar* d = out + fr[0] + at;
    if (type == RAW)
        group_copy(d, src + row[B_SRC], n, lane);
    else if (type == RLE)
        group_fill(d, src[row[B_SRC]], n, lane);
    else if (row[B_LITKIND] == 2)
        group_fill(d, (uchar)row[B_LITOFF], n, lane);
    else
        group_copy(d, row[B_LITKIND] == LIT_HUF ? lit + row[B_LITOFF] : src + row[B_LITOFF], n, lane);
}

// One work-group per frame.  err gets (code, block, detail) per frame.
kernel __attribute__((reqd_work_group_size(ZSTD_LANES, 1, 1)))
void zstd_execute(global const uchar* src, global const long* blocks, global const long* frames,
                  global const uchar* lit, global const uint4* seqs, global uchar* out, global long* err) {
    const int lane = get_local_id(0);
    const long f = get_group_id(0);
    global const long* fr = frames + f * FRAME_COLUMNS;
    global uchar* o = out + fr[0];
    const long size = fr[1], first = fr[2], nblocks = fr[3];
    long pos = 0, detail = 0, where = 0;
    int code = 0;
    uint rep0 = 1, rep1 = 4, rep2 = 8;
    for (long bi = first; bi < first + nblocks && !code; bi++) {
        global const long* row = blocks + bi * BLOCK_COLUMNS;
        long type = row[B_TYPE];
        where = row[B_INDEX];
        const int copied = row[B_PRE] >= 0;       // written by zstd_copy_blocks: checked here, not copied
        if (type == RAW || type == RLE) {
            long n = row[B_SIZE];
            if (n > size - pos) { code = type == RAW ? E_RAW_PAST : E_RLE_PAST; detail = n; break; }
            global const uchar* from = src + row[B_SRC];
            if (copied)
                ;
            else if (type == RAW)
                group_copy(o + pos, from, n, lane);
            else
                group_fill(o + pos, from[0], n, lane);
            pos += n;
            SYNC();
            continue;
        }
        const long remaining = size - pos, litlen = row[B_LITLEN];
        const long expected = min(BLOCK_MAX, remaining);
        if (litlen > expected) { code = E_LIT_SIZE; detail = litlen; break; }
        // how far this block may write: libzstd keeps the block's literals past it (see zstd_frames.py)
        long limit = remaining;
        if (row[B_LIMIT] != LIMIT_REMAINING) {
            if (remaining > BLOCK_MAX + 64 + litlen) limit = BLOCK_MAX + 32;
            else if (litlen > LIT_EXTRA) limit = expected;
        }
        const long kind = row[B_LITKIND];
        global const uchar* lsrc = kind == LIT_HUF ? lit + row[B_LITOFF] : src + row[B_LITOFF];
        const uchar rle = (uchar)row[B_LITOFF];
        const long nseq = row[B_NSEQ];
        global const uint4* sq = seqs + row[B_SEQ];
        global uchar* bo = o + pos;
        long bpos = 0, lused = 0;
        for (long i = 0; i < nseq; i++) {
            uint4 s = sq[i];
            long ll = s.x, ml = s.y;
            uint off;
            if (s.w == 0) {
                off = s.z;
                rep2 = rep1; rep1 = rep0; rep0 = off;
            } else if (s.w == 1) {
                if (s.z) { off = rep1; rep1 = rep0; rep0 = off; } else off = rep0;
            } else {
                uint idx = s.z;
                uint t = idx == 3 ? rep0 - 1 : idx == 1 ? rep1 : rep2;
                t += t == 0;
                if (idx != 1) rep2 = rep1;
                rep1 = rep0;
                rep0 = t;
                off = t;
            }
            if (ll + ml > limit - bpos) { code = E_SEQ_PAST; detail = i; break; }
            if (ll > litlen - lused) { code = E_LIT_PAST; detail = i; break; }
            if ((long)off > pos + bpos + ll) { code = E_OFFSET; detail = i; break; }
            if (off == 0) { code = E_OFFSET; detail = i; break; }    // (never from the rules above; no endless copy)
            if (kind == 2)
                group_fill(bo + bpos, rle, ll, lane);
            else
                group_copy(bo + bpos, lsrc + lused, ll, lane);
            SYNC();
            global uchar* d = bo + bpos + ll;
            global const uchar* m = d - off;
            if ((long)off >= ml) {
                group_copy(d, m, ml, lane);
            } else {
                // an overlapping match: rounds of at most off bytes, each reading only earlier rounds
                long chunk = min((long)off, (long)ZSTD_LANES);
                for (long done = 0; done < ml; done += chunk) {
                    long k = done + lane;
                    if (lane < chunk && k < ml) d[k] = m[k];
                    SYNC();
                }
            }
            SYNC();
            bpos += ll + ml;
            lused += ll;
        }
        if (code) break;
        long rest = litlen - lused;
        if (rest > limit - bpos) { code = E_LAST_PAST; detail = rest; break; }
        if (copied)
            ;
        else if (kind == 2)
            group_fill(bo + bpos, rle, rest, lane);
        else
            group_copy(bo + bpos, lsrc + lused, rest, lane);
        SYNC();
        pos += bpos + rest;
    }
    if (!code && pos != size) { code = E_SIZE; detail = pos; where = -1; }
    if (!code && fr[4]) {
        SYNC();
        if (lane == 0 && (uint)xxh64(o, size) != (uint)fr[5]) { code = E_CHECKSUM; where = -1; }
    }
    if (lane == 0) {
        err[3 * f] = code;
        err[3 * f + 1] = where;
        err[3 * f + 2] = detail;
    }
}
