// zstd decoding (RFC 8878) from the tables dgemm.opencl.codecs.zstd_frames makes on the host.
//
// Kernels, run in this order on one queue:
//   zstd_huf_trees:   one work-group per Huffman tree description decodes its weights and fills its
//                     lookup table (the host only finds where each description is);
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

// ---- Huffman tree descriptions (RFC 8878 4.2.1), decoded as zstd_entropy.py's huffman_tree decodes them ----
// The host finds each description (its first byte and its size, from that byte alone); zstd_huf_trees
// decodes the weights and builds the lookup table here, with the same arithmetic as the Python (which
// follows libzstd's, over-reads included), so that the same descriptions are taken and refused.

#ifndef ZSTD_TREE_LANES
#define ZSTD_TREE_LANES 4  // work-items per tree in zstd_huf_trees: lane 0 decodes the weights, all fill the table
#endif

#define HUF_SLOT 4096      // lookup-table entries per tree (2**12, libzstd's largest Huffman table log)
#define HUF_DESC_MAX 128   // a description's largest size: a header byte and 127 bytes of FSE-coded weights
#define HUF_DESC_PAD 144   // the private copy: the description, then zeros (the Python's short reads)
#define TREE_COLUMNS 3     // tree rows: first byte in src, size, block row (the host's)
#define TREE_INFO 4        // per tree out: table log (0: refused), error code, its detail, weights

// Error codes of zstd_huf_trees (zstd_decode.py's TREE_ERRORS has their messages).
#define T_PAST 1           // an FSE table description runs past its bytes
#define T_FSE_LOG 2        // an FSE table log over 15 (detail: the log)
#define T_SUM 3            // counts that do not add up to the table size
#define T_SYMBOLS 4        // symbols past 255
#define T_WEIGHTS_LOG 5    // the weights' FSE table log over 6 (detail: the log)
#define T_EMPTY 6          // no bitstream after the FSE table description
#define T_NO_MARK 7        // the bitstream's last byte is 0
#define T_MANY 8           // more than 255 weights
#define T_WEIGHT 9         // a weight over 12
#define T_ZERO 10          // all weights 0
#define T_DEPTH 11         // a tree deeper than 12 (detail: the depth)
#define T_POW2 12          // the implied last weight is not a power of 2
#define T_ONES 13          // an odd number (or fewer than 2) of weight-1 symbols

// Byte i of the description's copy; 0 past the copy (only the Python's short reads reach there).
inline uint desc_byte(const uchar* d, int i) { return (i >= 0 && i < HUF_DESC_PAD) ? d[i] : 0; }

inline uint desc_le32(const uchar* d, int i) {
    return desc_byte(d, i) | desc_byte(d, i + 1) << 8 | desc_byte(d, i + 2) << 16 | desc_byte(d, i + 3) << 24;
}

inline ulong desc_le64(const uchar* d, int i) {
    return (ulong)desc_le32(d, i) | (ulong)desc_le32(d, i + 4) << 32;
}

inline int tree_trailing_ones(uint v) {
    uint x = ~v | 0x80000000u;
    return popcount((x & (0u - x)) - 1u);
}

inline uint shr32(uint v, int n) { return n < 32 ? v >> n : 0u; }

// read_ncount: an FSE table description at d[at, at + size0) (symbols up to 255), the bytes after it zeros.
// Returns 0 or an error code; counts[0, *nsym) are the normalized counts.
int tree_ncount(const uchar* d, int at, int size0, short* counts, int* plog, int* pused, int* pnsym,
                int* detail) {
    // fewer than 8 bytes: libzstd reads a zero-padded copy of 8, as the zeros after the copy here are
    const int size = size0 < 8 ? 8 : size0;
    const int last = size - 4;
    int ip = 0;
    uint stream = desc_le32(d, at);
    int nbits = (int)(stream & 0xF) + 5;
    if (nbits > 15) { *detail = nbits; return T_FSE_LOG; }
    const int log = nbits;
    stream >>= 4;
    int bitcount = 4;
    int remaining = (1 << nbits) + 1;
    int threshold = 1 << nbits;
    nbits += 1;
    for (int s = 0; s < 256; s++) counts[s] = 0;
    int symbol = 0;
    bool previous0 = false;
    while (true) {
        if (previous0) {
            int repeats = tree_trailing_ones(stream) >> 1;
            while (repeats >= 12) {
                symbol += 36;
                if (ip <= size - 7) {
                    ip += 3;
                } else {
                    bitcount = (bitcount - 8 * (size - 7 - ip)) & 31;
                    ip = last;
                }
                stream = shr32(desc_le32(d, at + ip), bitcount);
                repeats = tree_trailing_ones(stream) >> 1;
            }
            symbol += 3 * repeats;
            stream >>= 2 * repeats;
            bitcount += 2 * repeats;
            symbol += stream & 3;
            bitcount += 2;
            if (symbol >= 256) break;
            if (ip <= size - 7 || ip + (bitcount >> 3) <= last) {
                ip += bitcount >> 3;
                bitcount &= 7;
            } else {
                bitcount = (bitcount - 8 * (last - ip)) & 31;
                ip = last;
            }
            stream = shr32(desc_le32(d, at + ip), bitcount);
        }
        int top = (2 * threshold - 1) - remaining;
        int count;
        if ((int)(stream & (uint)(threshold - 1)) < top) {
            count = (int)(stream & (uint)(threshold - 1));
            bitcount += nbits - 1;
        } else {
            count = (int)(stream & (uint)(2 * threshold - 1));
            if (count >= threshold) count -= top;
            bitcount += nbits;
        }
        count -= 1;
        remaining -= count >= 0 ? count : 1;
        counts[symbol] = (short)count;          // symbol < 256: checked before every count
        symbol += 1;
        previous0 = count == 0;
        if (remaining < threshold) {
            if (remaining <= 1) break;
            nbits = (31 - clz((uint)remaining)) + 1;
            threshold = 1 << (nbits - 1);
        }
        if (symbol >= 256) break;
        if (ip <= size - 7 || ip + (bitcount >> 3) <= last) {
            ip += bitcount >> 3;
            bitcount &= 7;
        } else {
            bitcount = (bitcount - 8 * (last - ip)) & 31;
            ip = last;
        }
        stream = shr32(desc_le32(d, at + ip), bitcount);
    }
    if (remaining != 1) return T_SUM;
    if (symbol > 256) { *detail = 255; return T_SYMBOLS; }
    if (bitcount > 32) return T_PAST;
    const int used = ip + ((bitcount + 7) >> 3);
    if (size0 < 8 && used > size0) return T_PAST;
    *plog = log;
    *pused = used;
    *pnsym = symbol;
    return 0;
}

// libzstd's backward bit container over the weights' bitstream (data index i is d[at + i], zeros past n).
typedef struct {
    const uchar* d;
    int at, ptr, consumed;
    ulong cont;
} wbits_t;

inline int wbits_reload(wbits_t* b) {
    if (b->consumed > 64) return 3;
    if (b->ptr >= 8) {
        b->ptr -= b->consumed >> 3;
        b->consumed &= 7;
        b->cont = desc_le64(b->d, b->at + b->ptr);
        return 0;
    }
    if (b->ptr == 0) return b->consumed < 64 ? 1 : 2;
    int k = b->consumed >> 3, r = 0;
    if (b->ptr - k < 0) {
        k = b->ptr;
        r = 1;
    }
    b->ptr -= k;
    b->consumed -= k * 8;
    b->cont = desc_le64(b->d, b->at + b->ptr);
    return r;
}

inline uint wbits_read(wbits_t* b, int k) {
    uint v = (uint)((b->cont >> ((64 - b->consumed - k) & 63)) & ((1UL << k) - 1));
    b->consumed += k;
    return v;
}

// One symbol of the weights' FSE stream from state *s (the next state back in *s).
inline uchar wbits_symbol(wbits_t* b, int* s, bool fast, const uchar* cells, const uchar* nb, const short* base) {
    int k = nb[*s];
    ulong v;
    if (fast) v = (b->cont << (b->consumed & 63)) >> ((64 - k) & 63);
    else v = (b->cont >> ((64 - b->consumed - k) & 63)) & ((1UL << k) - 1);
    b->consumed += k;
    uchar sym = cells[*s];
    *s = (base[*s] + (int)v) & 63;      // below 2**log (<= 64) already: the mask only bounds the arrays' reads
    return sym;
}

// _fse_weights: the weights of a description whose FSE part is d[1, 1 + head). Returns 0 or an error code.
int tree_fse_weights(const uchar* d, int head, uchar* w, int* pn, int* detail) {
    short counts[256];
    int log, used, nsym;
    int code = tree_ncount(d, 1, head, counts, &log, &used, &nsym, detail);
    if (code) return code;
    if (log > 6) { *detail = log; return T_WEIGHTS_LOG; }
    // small_cells: the symbols spread over 2**log cells, each cell's bit count and next-state base
    uchar cells[64], nb[64];
    short base[64];
    const int size = 1 << log, mask = size - 1;
    bool fast = true;
    int high = size - 1;
    for (int s = 0; s < nsym; s++) {
        if (counts[s] >= (1 << (log - 1))) fast = false;
        if (counts[s] == -1 && high >= 0) cells[high--] = (uchar)s;
    }
    const int step = (size >> 1) + (size >> 3) + 3;
    int p = 0;
    for (int s = 0; s < nsym; s++) {
        for (int c = 0; c < counts[s]; c++) {
            cells[p] = (uchar)s;
            p = (p + step) & mask;
            while (p > high) p = (p + step) & mask;
        }
    }
    for (int s = 0; s < nsym; s++) if (counts[s] == -1) counts[s] = 1;     // each symbol's next state number
    for (int u = 0; u < size; u++) {
        int s = cells[u];
        int st = counts[s]++;
        int k = log - (31 - clz((uint)st));
        nb[u] = (uchar)k;
        base[u] = (short)((st << k) - size);
    }
    const int n = head - used;          // the bitstream: d[1 + used, 1 + head)
    if (n < 1) return T_EMPTY;
    const uint lastb = d[head];
    if (lastb == 0) return T_NO_MARK;
    wbits_t b;
    b.d = d;
    b.at = 1 + used;
    const int mark = 31 - clz(lastb);
    if (n >= 8) {
        b.ptr = n - 8;
        b.consumed = 8 - mark;
    } else {
        b.ptr = 0;
        b.consumed = 8 - mark + (8 - n) * 8;
    }
    b.cont = desc_le64(d, b.at + b.ptr);
    int s1 = (int)wbits_read(&b, log);
    wbits_reload(&b);
    int s2 = (int)wbits_read(&b, log);
    wbits_reload(&b);
    int nw = 0;
    // 4 symbols per reload while the reload finds whole bytes (libzstd's loop, 64-bit build)
    while (wbits_reload(&b) == 0 && nw < 252) {
        w[nw++] = wbits_symbol(&b, &s1, fast, cells, nb, base);
        w[nw++] = wbits_symbol(&b, &s2, fast, cells, nb, base);
        w[nw++] = wbits_symbol(&b, &s1, fast, cells, nb, base);
        w[nw++] = wbits_symbol(&b, &s2, fast, cells, nb, base);
    }
    while (true) {
        if (nw > 253) return T_MANY;
        w[nw++] = wbits_symbol(&b, &s1, fast, cells, nb, base);
        if (wbits_reload(&b) == 3) {
            w[nw++] = wbits_symbol(&b, &s2, fast, cells, nb, base);
            break;
        }
        if (nw > 253) return T_MANY;
        w[nw++] = wbits_symbol(&b, &s2, fast, cells, nb, base);
        if (wbits_reload(&b) == 3) {
            w[nw++] = wbits_symbol(&b, &s1, fast, cells, nb, base);
            break;
        }
    }
    *pn = nw;
    return 0;
}

// One work-group per tree description (trees: rows of TREE_COLUMNS): lane 0 decodes the weights and the
// table's runs, then the lanes fill the table's 2**log entries (symbol | code length << 8) in the tree's
// HUF_SLOT-entry slot of huf; info gets (log, 0, 0, weights) or (0, error code, detail, 0).
kernel __attribute__((reqd_work_group_size(ZSTD_TREE_LANES, 1, 1)))
void zstd_huf_trees(global const uchar* src, global const long* trees, global ushort* huf, global int* info) {
    local ushort run_start[257], run_entry[257];
    local int shared[2];          // table log (0: refused), runs
    const int lane = get_local_id(0);
    const long t = get_group_id(0);
    if (lane == 0) {
        uchar d[HUF_DESC_PAD];
        uchar w[256];
        const long at = trees[t * TREE_COLUMNS];
        const int len = (int)min(trees[t * TREE_COLUMNS + 1], (long)HUF_DESC_MAX);   // the host's bound
        for (int i = 0; i < HUF_DESC_PAD; i++) d[i] = i < len ? src[at + i] : 0;
        int code = 0, detail = 0, n = 0, log = 0, runs = 0;
        const uint head = d[0];
        if (head >= 128) {                  // direct weights: 4 bits each
            n = head - 127;
            for (int i = 0; i < n; i++) w[i] = (i & 1) ? d[1 + i / 2] & 15 : d[1 + i / 2] >> 4;
        } else {
            code = tree_fse_weights(d, head, w, &n, &detail);
        }
        int total = 0;
        for (int i = 0; i < n && !code; i++) {
            if (w[i] > 12) { code = T_WEIGHT; detail = 12; }
            else total += (1 << w[i]) >> 1;
        }
        if (!code && total == 0) code = T_ZERO;
        if (!code) {
            log = (31 - clz((uint)total)) + 1;
            if (log > 12) { code = T_DEPTH; detail = log; }
        }
        if (!code) {
            const int rest = (1 << log) - total;
            if (rest & (rest - 1)) code = T_POW2;
            else w[n++] = (uchar)((31 - clz((uint)rest)) + 1);     // the implied last weight (n <= 255 before)
        }
        if (!code) {
            int ones = 0;
            for (int i = 0; i < n; i++) ones += w[i] == 1;
            if (ones < 2 || (ones & 1)) code = T_ONES;
        }
        if (!code) {                        // runs sorted by weight, then symbol; 2**(weight-1) entries each
            int pos = 0;
            for (int wt = 1; wt <= 12; wt++) {
                for (int s = 0; s < n; s++) {
                    if (w[s] != wt) continue;
                    run_start[runs] = (ushort)pos;
                    run_entry[runs] = (ushort)(s | (log + 1 - wt) << 8);
                    runs++;
                    pos += 1 << (wt - 1);
                }
            }
        }
        if (code) log = 0;
        shared[0] = log;
        shared[1] = runs;
        global int* out = info + t * TREE_INFO;
        out[0] = log;
        out[1] = code;
        out[2] = detail;
        out[3] = code ? 0 : n;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const int log = shared[0], runs = shared[1];
    if (log == 0) return;
    global ushort* table = huf + t * HUF_SLOT;
    for (int e = lane; e < (1 << log); e += ZSTD_TREE_LANES) {    // log <= 12: within the slot
        int lo = 0, hi = runs - 1;          // the last run starting at or before e
        while (lo < hi) {
            int mid = (lo + hi + 1) >> 1;
            if (run_start[mid] <= e) lo = mid;
            else hi = mid - 1;
        }
        table[e] = run_entry[lo];
    }
}

// One Huffman stream's literals; the lookup table is in local memory (its latency is each symbol's).
int huf_stream(global const uchar* src, global const long* row, int log, local const ushort* table,
               global uchar* lit) {
    long n = row[1], dlen = row[3];
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
// group loads the block's table (the slot zstd_huf_trees filled for the tree the stream row names) into
// local memory, then one work-item per stream (1 or 4) decodes.  A refused tree (log 0) decodes nothing:
// its error is the block's.
kernel __attribute__((reqd_work_group_size(ZSTD_HUF_LANES, 1, 1)))
void zstd_huf_streams(global const uchar* src, global const long* streams, global const long* groups,
                      global const ushort* huf, global const int* trees, global uchar* lit, global int* err) {
    local ushort table[HUF_SLOT];
    const int lane = get_local_id(0);
    const long first = groups[2 * get_group_id(0)], count = groups[2 * get_group_id(0) + 1];
    global const long* row = streams + (first + min((long)lane, count - 1)) * STREAM_COLUMNS;
    global const ushort* t = huf + row[4] * HUF_SLOT;
    const int log = trees[row[4] * TREE_INFO];
    // zstd_huf_trees writes 0 (refused) or 1..12; checked anyway, so the local table's writes stay inside it
    const bool usable = log > 0 && log <= 12;
    const int size = usable ? 1 << log : 0;
    for (int k = lane; k < size; k += ZSTD_HUF_LANES) table[k] = t[k];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lane < count) err[first + lane] = usable ? huf_stream(src, row, log, table, lit) : 0;
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

// The checks of a block's head at output position pos of a frame of size bytes, before its sequences:
// a raw or RLE block past the content size, a compressed block's literals over its bound.  Returns the
// error code (detail: its number) or 0, and for a compressed block how far it may write (*limit).
inline int block_head(global const long* row, long size, long pos, long* limit, long* detail) {
    const long type = row[B_TYPE];
    if (type == RAW || type == RLE) {
        long n = row[B_SIZE];
        if (n > size - pos) { *detail = n; return type == RAW ? E_RAW_PAST : E_RLE_PAST; }
        return 0;
    }
    const long remaining = size - pos, litlen = row[B_LITLEN];
    const long expected = min(BLOCK_MAX, remaining);
    if (litlen > expected) { *detail = litlen; return E_LIT_SIZE; }
    // how far this block may write: libzstd keeps the block's literals past it (see zstd_frames.py)
    long lim = remaining;
    if (row[B_LIMIT] != LIMIT_REMAINING) {
        if (remaining > BLOCK_MAX + 64 + litlen) lim = BLOCK_MAX + 32;
        else if (litlen > LIT_EXTRA) lim = expected;
    }
    *limit = lim;
    return 0;
}

// A block of the copied prefix (B_PRE >= 0: raw, RLE or sequence-free, written by zstd_copy_blocks): the
// walk's checks of it, a pure function of its row and its position B_PRE.  Returns the code or 0.
inline int prefix_check(global const long* row, long size, long* detail) {
    long limit = 0;
    int code = block_head(row, size, row[B_PRE], &limit, detail);
    if (code || row[B_TYPE] != 2) return code;
    const long rest = row[B_LITLEN];       // no sequences: every literal is a last literal
    if (rest > limit) { *detail = rest; return E_LAST_PAST; }
    return 0;
}

inline long block_out(global const long* row) { return row[B_TYPE] == 2 ? row[B_LITLEN] : row[B_SIZE]; }

// One work-group per frame.  err gets (code, block, detail) per frame.
// The frame's copied prefix is checked by the lanes at once (each a strided subset, the earliest failing
// block by a local minimum), then the walk starts after it.
kernel __attribute__((reqd_work_group_size(ZSTD_LANES, 1, 1)))
void zstd_execute(global const uchar* src, global const long* blocks, global const long* frames,
                  global const uchar* lit, global const uint4* seqs, global uchar* out, global long* err) {
    local int npre, bad;
    const int lane = get_local_id(0);
    const long f = get_group_id(0);
    global const long* fr = frames + f * FRAME_COLUMNS;
    global uchar* o = out + fr[0];
    const long size = fr[1], first = fr[2], nblocks = fr[3];
    long pos = 0, detail = 0, where = 0;
    int code = 0;
    uint rep0 = 1, rep1 = 4, rep2 = 8;
    if (lane == 0) { npre = (int)nblocks; bad = (int)nblocks; }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (long k = lane; k < nblocks; k += ZSTD_LANES) {
        global const long* row = blocks + (first + k) * BLOCK_COLUMNS;
        long d;
        if (row[B_PRE] < 0) { atomic_min(&npre, (int)k); break; }     // the prefix ends before k
        if (prefix_check(row, size, &d)) { atomic_min(&bad, (int)k); break; }   // (later ones lose)
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    long start = npre;
    if (bad < npre) {
        global const long* row = blocks + (first + bad) * BLOCK_COLUMNS;
        code = prefix_check(row, size, &detail);
        where = row[B_INDEX];
        start = nblocks;
    } else if (npre > 0) {
        global const long* row = blocks + (first + npre - 1) * BLOCK_COLUMNS;
        pos = row[B_PRE] + block_out(row);
    }
    for (long bi = first + start; bi < first + nblocks && !code; bi++) {
        global const long* row = blocks + bi * BLOCK_COLUMNS;
        long type = row[B_TYPE];
        where = row[B_INDEX];
        long limit = 0;
        code = block_head(row, size, pos, &limit, &detail);
        if (code) break;
        if (type == RAW || type == RLE) {
            long n = row[B_SIZE];
            global const uchar* from = src + row[B_SRC];
            if (type == RAW)
                group_copy(o + pos, from, n, lane);
            else
                group_fill(o + pos, from[0], n, lane);
            pos += n;
            SYNC();
            continue;
        }
        const long litlen = row[B_LITLEN];
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
        if (kind == 2)
            group_fill(bo + bpos, rle, rest, lane);
        else
            group_copy(bo + bpos, lsrc + lused, rest, lane);
        SYNC();
        pos += bpos + rest;
    }
    if (!code && pos != size) { code = E_SIZE; detail = pos; where = -1; }
    SYNC();         // (unconditional: PoCL mishandles private values across a barrier under a branch here)
    if (!code && fr[4]) {
        if (lane == 0 && (uint)xxh64(o, size) != (uint)fr[5]) { code = E_CHECKSUM; where = -1; }
    }
    if (lane == 0) {
        err[3 * f] = code;
        err[3 * f + 1] = where;
        err[3 * f + 2] = detail;
    }
}
