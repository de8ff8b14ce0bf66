// zstd decoding (RFC 8878) from the tables dgemm.opencl.codecs.zstd_frames makes on the host.
//
// Kernels, run in this order on one queue:
//   zstd_huf_trees:   one work-group per Huffman tree description decodes its weights and fills its
//                     lookup table (the host only finds where each description is);
//   zstd_huf_streams: every Huffman literal stream of every block of every frame at once, a
//                     work-group per block sharing its table in local memory, each stream split
//                     among ZSTD_HUF_SPLIT work-items (reader 6), decodes its literals into the
//                     literal buffer, or into the output for a block whose literals are its output
//                     at a place the host knows;
//   zstd_sequences:   one work-item per compressed block with sequences decodes its FSE bitstream
//                     into (literal length, match length, offset code) rows;
//   zstd_copy_blocks: one work-group per block whose output position the host knows (raw, RLE and
//                     sequence-free blocks before a frame's first block with sequences) copies it;
//   zstd_block_scan, zstd_frame_scan, zstd_blocks, zstd_execute: the sequences executed, blocks
//                     one work-group each where they can (see "Sequence execution" below).
// Every read is bounded by its stream, every write by its frame's output; what is wrong goes to
// an error row that the host turns into a message.  Bitstreams are read strictly: a stream must
// end exactly where its last symbol or sequence does, and no bit before its start is ever read.

#ifndef ZSTD_HUF_LANES
#define ZSTD_HUF_LANES 4  // work-items per block in zstd_huf_streams (they load its table; 1 or 4 decode)
#endif

#ifndef ZSTD_LANES
#define ZSTD_LANES 1      // work-items per block or frame in execution: a warp or more on a GPU, 1 on a CPU
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
#define E_ZERO_OFFSET 20     // repeat offset 1 less 1 (after no literals) is 0

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
// The bitstream is read in aligned 16-byte quads, double-buffered: while the 64-bit window takes its
// 32-bit words from the current quad, the next one is already on its way (about 17 symbols ahead), so no
// symbol waits on global memory.  (A ring of single words moved register to register does not do this:
// moving a word still in flight waits for it.)  src's buffer is aligned and padded by the host, so the
// quad holding the stream's last byte is inside it.  Bits below the stream's start read as 0 (RFC 8878).
// Literals are stored four at a time once the output is 4-byte aligned.
#define HUF_QUAD(i) qp[max((i), -qb)]
// The window's next word once fewer than 12 bits of it are left (a symbol's longest code), the next quad
// loaded as the current one runs out.
#define HUF_REFILL() do {                                                                      \
        if (r - 12 < lo) {                                                                     \
            uint w_ = k == 4 ? cur.w : k == 3 ? cur.z : k == 2 ? cur.y : cur.x;                \
            acc = (acc << 32) | w_;                                                            \
            lo -= 32;                                                                          \
            if (--k == 0) { cur = nxt; nxt = HUF_QUAD(nq); nq--; k = 4; }                      \
        }                                                                                      \
    } while (0)
#define HUF_SYM(sym) do {                                                                      \
        uint v_ = (uint)(acc >> (r - log - lo)) & mask;                                        \
        if (pos < log) v_ &= 0xFFFFFFFFu << (log - pos);                                       \
        ushort e_ = table[v_];                                                                 \
        int len_ = e_ >> 8;                                                                    \
        if (len_ > pos) return E_OVERREAD;                                                     \
        pos -= len_;                                                                           \
        r -= len_;                                                                             \
        sym = (uchar)e_;                                                                       \
        HUF_REFILL();                                                                          \
    } while (0)

// HUF_SYM without its checks, where they cannot fail: 12 bits or more left before the symbol (a code is at
// most 12 bits), so none is masked and none overruns.  Only r moves (pos is r less a constant).
#define HUF_SYM_FAST(sym) do {                                                                 \
        const ushort e_ = table[(uint)(acc >> (r - log - lo)) & mask];                         \
        r -= e_ >> 8;                                                                          \
        sym = (uchar)e_;                                                                       \
        HUF_REFILL();                                                                          \
    } while (0)

#ifndef ZSTD_HUF_FAST
#define ZSTD_HUF_FAST 1     // 1: reader 1 decodes without checks while they cannot fail (HUF_SYM_FAST); 0: never
#endif

#ifndef ZSTD_HUF_LOCAL
#define ZSTD_HUF_LOCAL 1    // readers 0-2: 1, each block's lookup table copied into local memory (reader 5
                            // always does); 0: read where the trees
#endif                      // kernel left it (global memory, through the L1 cache): no local memory, more groups
#if ZSTD_HUF_LOCAL
#define HUF_TABLE_SPACE local
#else
#define HUF_TABLE_SPACE global
#endif

#ifndef ZSTD_HUF_READER
#define ZSTD_HUF_READER 6   // 6: reader 5's, each stream split among work-items (below); 5: words loaded one
                            // refill ahead, refills of selects every two symbols (below);
#endif                      // 1: aligned quads, double-buffered, literals stored 4 at a time; 2: reader 1,
                            // literals stored one by one; 0: 8 bytes (vload8) at each refill, one by one
#ifndef ZSTD_HUF_ILP
#define ZSTD_HUF_ILP 1      // reader 5: streams a work-item decodes in step (1, 2 or 4; of one block)
#endif
#ifndef ZSTD_HUF_BLOCKS
#define ZSTD_HUF_BLOCKS 1   // reader 5: blocks a work-group decodes (each its own table in local memory)
#endif
#ifndef ZSTD_HUF_AHEAD
#define ZSTD_HUF_AHEAD 1    // reader 5: words loaded ahead of the window (1 or 2: H100, 1 % faster, in the noise)
#endif
#if ZSTD_HUF_AHEAD != 1 && ZSTD_HUF_AHEAD != 2
#error "ZSTD_HUF_AHEAD must be 1 or 2"
#endif

#if ZSTD_HUF_READER == 5 || ZSTD_HUF_READER == 6
// ---- readers 5 and 6 (6: reader 5's bit reader, each stream split among work-items; below) ----
// The profiler (bench/notes/issue-28/gpu_session_huffman_source.sh, per-instruction stall samples) showed
// where reader 1's symbols wait: its refill, a branch after every symbol, picks the window's next word from
// a quad in more branches; and when a quad runs out the compiler loads the next one into spare registers and
// copies them at once, so a quarter of all stalls waited on that fresh load.  Here the window takes a word
// (a plain 32-bit load, issued every time, into its own register: nothing copies it) loaded at the refill
// before, and the refill is selects, once every two symbols: 24 bits or more are in the window before a
// pair (a code is at most 12 bits), 24 or more again after the refill.  H100, Zarr-default level 3, 4 chunks
// a call: Huffman 52.8 GB/s (reader 1) -> 90.7.  ILP streams a work-item in step (so their chains fill each
// other's stalls) and several blocks a work-group (more lanes a warp) were both slower there (59 and 73).
// Same reads, checks and results as reader 1.
#if ZSTD_HUF_ILP != 1 && ZSTD_HUF_ILP != 2 && ZSTD_HUF_ILP != 4
#error "ZSTD_HUF_ILP must be 1, 2 or 4"
#endif
#define HUF_PER_BLOCK (4 / ZSTD_HUF_ILP)   // work-items decoding a block's (up to) 4 streams
#if ZSTD_HUF_BLOCKS * HUF_PER_BLOCK > ZSTD_HUF_LANES
#error "ZSTD_HUF_LANES must hold ZSTD_HUF_BLOCKS * 4 / ZSTD_HUF_ILP work-items"
#endif
#define HUF_INLINE inline __attribute__((always_inline))   // the states stay in registers

typedef struct {
    global const uint* wp;    // word 0: the first of the 16-byte quad holding the stream's first byte
    int wmin;                 // the lowest word index read (src's first; bits below the stream are masked)
    int r, lo, off;           // r - off: the bits not yet read (pos); the window acc holds bits [lo, lo + 64)
    int wi;                   // the word the window takes next, already loaded into fresh
    ulong acc;
#if ZSTD_HUF_READER == 6
    // Reader 6's 32 work-items a warp read 32 places: a 16-byte load (quad wi >> 2 of wp, no lower than
    // src's first, wmin >> 2) is a quarter of the memory transactions of four word loads (what bound it
    // with word loads issued every two symbols).
    uint4 cur, nxt;           // the quad holding word wi, and the one below it (loaded one quad ahead)
#else
    uint fresh;
#if ZSTD_HUF_AHEAD == 2
    uint fresh2;              // word wi - 1
#endif
#endif
} huf_t;

// The bits of a stream of n bytes at s0 (the end mark's position): where its first symbol starts.
HUF_INLINE int huf_start(global const uchar* src, const long s0, const int n) {
    const uchar last = src[s0 + n - 1];       // not 0: the host checked
    return 8 * (n - 1) + (31 - clz((uint)last));
}

#if ZSTD_HUF_READER == 6
// Quad q of the stream's words (word 4q to 4q + 3), no lower than src's first.
HUF_INLINE uint4 huf_quad(const huf_t* h, const int q) {
    return ((global const uint4*)h->wp)[max(q, h->wmin >> 2)];
}
#endif

// The reader at bit pos (pos bits not yet read; 0 only where a stream holds its end mark alone) of the stream at s0.
HUF_INLINE void huf_open_at(huf_t* h, global const uchar* src, const long s0, const int pos) {
    const int qb = (int)(s0 >> 4);
    h->wp = (global const uint*)((global const uint4*)src + qb);
    h->wmin = -4 * qb;
    h->r = pos + (int)(s0 & 15) * 8;
    h->off = h->r - pos;
    const int hi = (h->r - 1) >> 5;
    h->lo = (hi - 1) * 32;                    // 33 to 64 bits in the window
    h->acc = ((ulong)h->wp[max(hi, h->wmin)] << 32) | h->wp[max(hi - 1, h->wmin)];
    h->wi = hi - 2;
#if ZSTD_HUF_READER == 6
    h->cur = huf_quad(h, h->wi >> 2);
    h->nxt = huf_quad(h, (h->wi >> 2) - 1);
#else
    h->fresh = h->wp[max(h->wi, h->wmin)];
#if ZSTD_HUF_AHEAD == 2
    h->fresh2 = h->wp[max(h->wi - 1, h->wmin)];
#endif
#endif
}

#if ZSTD_HUF_READER == 6
// The window takes word wi (from the current quad); the next quad is loaded as this one runs out.
HUF_INLINE void huf_shift(huf_t* h) {
    const int k = h->wi & 3;
    const uint w = k == 3 ? h->cur.w : k == 2 ? h->cur.z : k == 1 ? h->cur.y : h->cur.x;
    h->acc = (h->acc << 32) | w;
    h->lo -= 32;
    h->wi--;
    if (k == 0) {
        h->cur = h->nxt;
        h->nxt = huf_quad(h, (h->wi >> 2) - 1);
    }
}
#endif

HUF_INLINE void huf_open(huf_t* h, global const uchar* src, const long s0, const int n) {
    huf_open_at(h, src, s0, huf_start(src, s0, n));
}

// After a checked symbol: 12 bits or more in the window again.
HUF_INLINE void huf_refill(huf_t* h) {
#if ZSTD_HUF_READER == 6
    if (h->r - 12 < h->lo) huf_shift(h);
#else
    if (h->r - 12 < h->lo) {
        h->acc = (h->acc << 32) | h->fresh;
        h->lo -= 32;
        h->wi--;
#if ZSTD_HUF_AHEAD == 2
        h->fresh = h->fresh2;
        h->fresh2 = h->wp[max(h->wi - 1, h->wmin)];
#else
        h->fresh = h->wp[max(h->wi, h->wmin)];
#endif
    }
#endif
}

// After two unchecked symbols: 24 bits or more in the window again.
HUF_INLINE void huf_take(huf_t* h) {
#if ZSTD_HUF_READER == 6
    if (h->r - h->lo < 24) huf_shift(h);
#else
    const bool need = h->r - h->lo < 24;
    h->acc = need ? (h->acc << 32) | h->fresh : h->acc;
    h->lo -= need ? 32 : 0;
    h->wi -= need ? 1 : 0;
#if ZSTD_HUF_AHEAD == 2
    h->fresh = need ? h->fresh2 : h->fresh;
    h->fresh2 = h->wp[max(h->wi - 1, h->wmin)];
#else
    h->fresh = h->wp[max(h->wi, h->wmin)];
#endif
#endif
}

// A symbol with no check and no refill.
HUF_INLINE uchar huf_peek(huf_t* h, local const ushort* table, const int log, const uint mask) {
    const ushort e = table[(uint)(h->acc >> (h->r - log - h->lo)) & mask];
    h->r -= e >> 8;
    return (uchar)e;
}

// Four symbols of a stream with 48 bits or more left (no check can fail), into a, b, c, d.
#define HUF_FOUR(h, a, b, c, d) do {                                                             \
        a = huf_peek(h, table, log, mask); b = huf_peek(h, table, log, mask); huf_take(h);      \
        c = huf_peek(h, table, log, mask); d = huf_peek(h, table, log, mask); huf_take(h);      \
    } while (0)

// HUF_SYM: a symbol, or -1 where its code reaches below the stream's start
HUF_INLINE int huf_checked(huf_t* h, local const ushort* table, const int log, const uint mask) {
    const int pos = h->r - h->off;
    uint v = (uint)(h->acc >> (h->r - log - h->lo)) & mask;
    if (pos < log) v &= 0xFFFFFFFFu << (log - pos);
    const ushort e = table[v];
    const int len = e >> 8;
    if (len > pos) return -1;
    h->r -= len;
    huf_refill(h);
    return (uchar)e;
}

HUF_INLINE void huf_store4(global uchar* out, const long i, const bool aligned, const uchar a, const uchar b,
                           const uchar c, const uchar d) {
    if (aligned) {
        *(global uint*)(out + i) = (uint)a | (uint)b << 8 | (uint)c << 16 | (uint)d << 24;
    } else {
        out[i] = a; out[i + 1] = b; out[i + 2] = c; out[i + 3] = d;
    }
}

// One stream from symbol i on (reader 1's loops): 0 or its error code.
HUF_INLINE int huf_finish(huf_t* h, local const ushort* table, const int log, global uchar* out, long i, const long dlen) {
    const uint mask = (1u << log) - 1;
    const bool aligned = (((ulong)out) & 3) == 0;
    for (; ZSTD_HUF_FAST && i + 4 <= dlen && h->r - h->off >= 48; i += 4) {
        uchar a, b, c, d;
        HUF_FOUR(h, a, b, c, d);
        huf_store4(out, i, aligned, a, b, c, d);
    }
    for (; i + 4 <= dlen; i += 4) {
        const int a = huf_checked(h, table, log, mask);
        if (a < 0) return E_OVERREAD;
        const int b = huf_checked(h, table, log, mask);
        if (b < 0) return E_OVERREAD;
        const int c = huf_checked(h, table, log, mask);
        if (c < 0) return E_OVERREAD;
        const int d = huf_checked(h, table, log, mask);
        if (d < 0) return E_OVERREAD;
        huf_store4(out, i, aligned, (uchar)a, (uchar)b, (uchar)c, (uchar)d);
    }
    for (; i < dlen; i++) {
        const int a = huf_checked(h, table, log, mask);
        if (a < 0) return E_OVERREAD;
        out[i] = (uchar)a;
    }
    return h->r - h->off != 0 ? E_LEFTOVER : 0;
}

#if ZSTD_HUF_READER == 5
// Work-group g decodes blocks g * ZSTD_HUF_BLOCKS ... (the host pads groups with empty rows to a whole
// number of work-groups); work-item l decodes streams (l % HUF_PER_BLOCK) * ZSTD_HUF_ILP ... of block
// l / HUF_PER_BLOCK, its ILP streams in step while all hold 48 bits or more, then one by one.
kernel __attribute__((reqd_work_group_size(ZSTD_HUF_LANES, 1, 1)))
void zstd_huf_streams(global const uchar* src, global const long* streams, global const long* groups,
                      global const ushort* huf, global const int* trees, global uchar* lit, global uchar* out,
                      global int* err) {
    local ushort tables[ZSTD_HUF_BLOCKS * HUF_SLOT];
    const int lid = get_local_id(0);
    const long g0 = (long)get_group_id(0) * ZSTD_HUF_BLOCKS;
    for (int b = 0; b < ZSTD_HUF_BLOCKS; b++) {         // every lane fills every block's table
        const long first = groups[2 * (g0 + b)], count = groups[2 * (g0 + b) + 1];
        if (count == 0) continue;
        const long tree = streams[first * STREAM_COLUMNS + 4];   // a block's streams share its tree
        const int log = trees[tree * TREE_INFO];
        // zstd_huf_trees writes 0 (refused) or 1..12; checked anyway, so the writes stay in the slot
        const int size = log > 0 && log <= 12 ? 1 << log : 0;
        global const ushort* t = huf + tree * HUF_SLOT;
        for (int k = lid; k < size; k += ZSTD_HUF_LANES) tables[b * HUF_SLOT + k] = t[k];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const int b = lid / HUF_PER_BLOCK;
    if (b >= ZSTD_HUF_BLOCKS) return;
    const long first = groups[2 * (g0 + b)], count = groups[2 * (g0 + b) + 1];
    const long j0 = (lid % HUF_PER_BLOCK) * ZSTD_HUF_ILP;
    if (j0 >= count) return;
    const long tree = streams[first * STREAM_COLUMNS + 4];
    const int log = trees[tree * TREE_INFO];
    if (log <= 0 || log > 12) {             // a refused tree decodes nothing: its error is the block's
        for (long j = j0; j < min(count, j0 + ZSTD_HUF_ILP); j++) err[first + j] = 0;
        return;
    }
    local const ushort* table = tables + b * HUF_SLOT;
    const uint mask = (1u << log) - 1;
    huf_t h[ZSTD_HUF_ILP];
#if ZSTD_HUF_ILP > 1
    if (j0 + ZSTD_HUF_ILP <= count) {       // all ILP streams: in step
        global uchar* o[ZSTD_HUF_ILP];
        long dlen[ZSTD_HUF_ILP];
        long i = 0, common = LONG_MAX;
        bool aligned[ZSTD_HUF_ILP];
#pragma unroll
        for (int j = 0; j < ZSTD_HUF_ILP; j++) {
            global const long* row = streams + (first + j0 + j) * STREAM_COLUMNS;
            huf_open(&h[j], src, row[0], (int)row[1]);
            o[j] = (row[5] ? out : lit) + row[2];
            dlen[j] = row[3];
            aligned[j] = (((ulong)o[j]) & 3) == 0;
            common = min(common, dlen[j]);
        }
        for (; ZSTD_HUF_FAST && i + 4 <= common; i += 4) {
            bool room = true;
#pragma unroll
            for (int j = 0; j < ZSTD_HUF_ILP; j++) room = room && h[j].r - h[j].off >= 48;
            if (!room) break;
            uchar s[ZSTD_HUF_ILP][4];
#pragma unroll
            for (int q = 0; q < 4; q += 2) {
#pragma unroll
                for (int j = 0; j < ZSTD_HUF_ILP; j++) s[j][q] = huf_peek(&h[j], table, log, mask);
#pragma unroll
                for (int j = 0; j < ZSTD_HUF_ILP; j++) s[j][q + 1] = huf_peek(&h[j], table, log, mask);
#pragma unroll
                for (int j = 0; j < ZSTD_HUF_ILP; j++) huf_take(&h[j]);
            }
#pragma unroll
            for (int j = 0; j < ZSTD_HUF_ILP; j++) huf_store4(o[j], i, aligned[j], s[j][0], s[j][1], s[j][2], s[j][3]);
        }
#pragma unroll
        for (int j = 0; j < ZSTD_HUF_ILP; j++) err[first + j0 + j] = huf_finish(&h[j], table, log, o[j], i, dlen[j]);
        return;
    }
#endif
    for (long j = j0; j < count && j < j0 + ZSTD_HUF_ILP; j++) {    // fewer streams than ILP: one by one
        global const long* row = streams + (first + j) * STREAM_COLUMNS;
        huf_open(&h[0], src, row[0], (int)row[1]);
        err[first + j] = huf_finish(&h[0], table, log, (row[5] ? out : lit) + row[2], 0, row[3]);
    }
}
#else   // ZSTD_HUF_READER == 6
// ---- reader 6: a stream split among work-items (self-synchronizing decode) ----
// Reader 5 decodes a stream on one work-item: 32 Ki symbols of a 128 KiB block one after another, each a
// table lookup's latency, while a block's work-group holds its place on the device (beside the GEMMs, the
// place a GEMM work-group would have taken).  A Huffman code is a prefix code, and a decode started at any
// bit (not only at a symbol's start) falls onto the true symbol starts within a few symbols: on Zarr's float
// chunks 9 on average, 99 % within 38-51, at most 97 (bench/notes/issue-28/huffman_sync.py).  So
// ZSTD_HUF_SPLIT work-items share a stream, each from a bit of its own (Weissenberger and Schmidt,
// "Massively Parallel Huffman Decoding on GPUs", ICPP 2018):
//   1. each counts the symbols that start in its part of the stream, from its part's first bit, and where
//      it leaves the part (its exit: the first symbol start at or below the next part's first bit);
//   2. each re-reads its part from the exit of the part before (a true symbol start once that part is
//      settled), in step with its first read, until the two meet (a common position: from there on they are
//      the same read) and corrects its count; where they do not meet in its part, its count and exit are
//      the new read's, and the part after it re-reads in the next round (rounds end when no exit moved: at
//      most one a part, as part 0 starts where the stream does);
//   3. each decodes its part's symbols from its true start into its place (the counts before it).
// Loads and stores are 16 bytes wide (huf_shift, huf_place): with word loads issued every two symbols and
// byte stores, a warp's 32 places bound the kernel (57-66 GB/s, slower than reader 5).  H200, Zarr-default
// level 3, 4 chunks of 64 MiB a call: Huffman 91 GB/s (reader 5) -> 188 at 16 work-items a stream (126 at
// 8, 182 at 32), all decode kernels 64 -> 100; beside the GEMMs, the GEMMs' time lost per decoded GB 13-20 ms
// -> 9-14 (bench/NOTES.md, issue 28, twenty-first session).
// The error is the serial read's: fewer symbols than the stream's literals before the stream's bits run
// out (a code reaching below its start) is an overread; more, or bits left, is leftover.  Every read is
// reader 5's, bounded the same way; every write is below the stream's literal count.
#ifndef ZSTD_HUF_SPLIT
#define ZSTD_HUF_SPLIT 16   // work-items a stream (ZSTD_HUF_LANES = 4 * ZSTD_HUF_SPLIT: a block's 4 streams)
#endif
#if ZSTD_HUF_LANES != 4 * ZSTD_HUF_SPLIT || ZSTD_HUF_BLOCKS != 1 || ZSTD_HUF_ILP != 1
#error "reader 6: ZSTD_HUF_LANES = 4 * ZSTD_HUF_SPLIT, one block a work-group, ILP 1"
#endif
#define HUF_PART_MIN 64     // a part's fewest bits: a symbol (12 bits or fewer) never crosses a whole part

HUF_INLINE int huf_pos(const huf_t* h) { return h->r - h->off; }

// Where a read that counted down to stop ended, as one number: its position (stop or below, never below 0)
// or, where a code reached below the stream's start (only in the last part), -1 less its position.
HUF_INLINE int huf_stuck(const huf_t* h) { return -1 - huf_pos(h); }

// Count the symbols that start above bit stop, from h's position; h ends at the first start at or below
// stop, or stuck (*end < 0).  Four symbols need no check while 48 bits or more lie above stop.  A code
// takes a bit or more, so no read counts more symbols than bits (a bound that only a table with codes of
// no bits, which zstd_huf_trees never makes, would reach: the loops end whatever the table holds).
HUF_INLINE int huf_count(huf_t* h, local const ushort* table, const int log, const uint mask, const int stop,
                         int* end) {
    const int most = huf_pos(h) - stop;
    int n = 0;
    for (; huf_pos(h) - stop >= 48 && n < most; n += 4) {
        uchar a, b, c, d;
        HUF_FOUR(h, a, b, c, d);
    }
    while (huf_pos(h) > stop && n < most) {
        if (huf_checked(h, table, log, mask) < 0) { *end = huf_stuck(h); return n; }
        n++;
    }
    *end = huf_pos(h);
    return n;
}

// m symbols of the read's true path into o: one by one until o is 16-byte aligned, then 16 at a time (a
// 16-byte store: a warp's 32 work-items write 32 places, a quarter of the transactions of 4-byte stores),
// the rest as reader 5 stores them.
HUF_INLINE void huf_place(huf_t* h, local const ushort* table, const int log, const uint mask, global uchar* o,
                          const long m) {
    long i = min(m, (long)((16 - ((ulong)o & 15)) & 15));
    for (long k = 0; k < i; k++) o[k] = (uchar)huf_checked(h, table, log, mask);
    huf_take(h);            // 24 bits or more in the window, as the unchecked pairs need (a checked symbol: 12)
    for (; i + 16 <= m && huf_pos(h) >= 192; i += 16) {     // 16 codes of 12 bits or fewer: no check
        uint w[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            uchar a, b, c, d;
            HUF_FOUR(h, a, b, c, d);
            w[q] = (uint)a | (uint)b << 8 | (uint)c << 16 | (uint)d << 24;
        }
        *(global uint4*)(o + i) = (uint4)(w[0], w[1], w[2], w[3]);
    }
    huf_finish(h, table, log, o + i, 0, m - i);
}

// One checked step of a re-read: its new key (its position, or where it stuck: huf_stuck).
HUF_INLINE int huf_step(huf_t* h, local const ushort* table, const int log, const uint mask) {
    if (huf_checked(h, table, log, mask) < 0) return huf_stuck(h);
    return huf_pos(h);
}

kernel __attribute__((reqd_work_group_size(ZSTD_HUF_LANES, 1, 1)))
void zstd_huf_streams(global const uchar* src, global const long* streams, global const long* groups,
                      global const ushort* huf, global const int* trees, global uchar* lit, global uchar* out,
                      global int* err) {
    local ushort table[HUF_SLOT];
    local int count[ZSTD_HUF_LANES], exit_at[ZSTD_HUF_LANES], from[ZSTD_HUF_LANES];
    local int moved;
    const int lid = get_local_id(0);
    const long first = groups[2 * get_group_id(0)], nstreams = groups[2 * get_group_id(0) + 1];
    const long tree = nstreams > 0 ? streams[first * STREAM_COLUMNS + 4] : 0;   // a block's streams share it
    const int log = nstreams > 0 ? trees[tree * TREE_INFO] : 0;
    const bool usable = log > 0 && log <= 12;      // zstd_huf_trees writes 0 (refused) or 1..12
    const int size = usable ? 1 << log : 0;
    for (int k = lid; k < size; k += ZSTD_HUF_LANES) table[k] = huf[tree * HUF_SLOT + k];
    const int s = lid / ZSTD_HUF_SPLIT, part = lid % ZSTD_HUF_SPLIT;
    const bool mine = usable && s < nstreams;
    global const long* row = streams + (first + min((long)s, max(nstreams - 1, 0L))) * STREAM_COLUMNS;
    const long s0 = row[0];
    const int start = mine ? huf_start(src, s0, (int)row[1]) : 0;
    // parts of HUF_PART_MIN bits or more: part k reads the symbols starting in (top(k + 1), top(k)]
    const int parts = clamp(start / HUF_PART_MIN, 1, ZSTD_HUF_SPLIT), step = start / parts;
    const int top = start - part * step, stop = part + 1 < parts ? top - step : 0;
    const bool active = mine && part < parts;
    const uint mask = (1u << log) - 1;
    barrier(CLK_LOCAL_MEM_FENCE);
    huf_t h;
    if (active) {           // 1: counted from the part's first bit
        int end;
        huf_open_at(&h, src, s0, top);
        count[lid] = huf_count(&h, table, log, mask, stop, &end);
        exit_at[lid] = end;
        from[lid] = top;
    }
    for (;;) {              // 2: rounds of re-reads from the exit before, until no exit moves
        barrier(CLK_LOCAL_MEM_FENCE);
        const int at = active && part > 0 ? exit_at[lid - 1] : 0;
        if (lid == 0) moved = 0;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (active && part > 0 && at != from[lid]) {
            huf_t b;                           // the read that gave count, in step with the new one (h)
            huf_open_at(&h, src, s0, at);
            huf_open_at(&b, src, s0, from[lid]);
            // the read further from the stream's start steps, until they meet or the new one has left the part
            // (a read that stuck never meets the other, which is below it: mb counts no stuck step)
            int ka = at, kb = from[lid], ma = 0, mb = 0;
            const int most = 2 * (max(at, from[lid]) - stop) + 24;     // (huf_count's bound, both reads)
            while (ka != kb && ka > stop && ma + mb < most) {
                if (ka > kb) { ka = huf_step(&h, table, log, mask); ma += ka >= 0; }   // (stuck: no symbol)
                else { kb = huf_step(&b, table, log, mask); mb++; }
            }
            if (ka == kb) {
                count[lid] += ma - mb;         // the same read from the meeting on
            } else {                           // no meeting: the new read is the part's, to its end
                count[lid] = ma;
                if (ka != exit_at[lid]) atomic_or(&moved, 1);     // (several parts may say so at once)
                exit_at[lid] = ka;
            }
            from[lid] = at;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!moved) break;
    }
    if (!active) {          // a refused tree decodes nothing: its error is the block's
        if (!usable && part == 0 && s < nstreams) err[first + s] = 0;
        return;
    }
    long before = 0, total = 0;                // 3: each part's symbols into place
    for (int k = 0; k < parts; k++) {
        const int c = count[s * ZSTD_HUF_SPLIT + k];
        before += k < part ? c : 0;
        total += c;
    }
    const long dlen = row[3];
    global uchar* o = (row[5] ? out : lit) + row[2];
    if (before < dlen) {
        huf_open_at(&h, src, s0, from[lid]);
        huf_place(&h, table, log, mask, o + before, min((long)count[lid], dlen - before));
    }
    if (part == 0) {
        const int end = exit_at[s * ZSTD_HUF_SPLIT + parts - 1];
        err[first + s] = total < dlen ? E_OVERREAD : total == dlen && end == 0 ? 0 : E_LEFTOVER;
    }
}
#endif  // ZSTD_HUF_READER == 5, else 6
#else

#if ZSTD_HUF_READER == 0
int huf_stream(global const uchar* src, global const long* row, int log, HUF_TABLE_SPACE const ushort* table,
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
#else

int huf_stream(global const uchar* src, global const long* row, int log, HUF_TABLE_SPACE const ushort* table,
               global uchar* lit) {
    const long s0 = row[0], dlen = row[3];
    const int n = (int)row[1];
    global uchar* out = lit + row[2];         // (lit: the literals, or the output where the stream's row says)
    const int qb = (int)(s0 >> 4);            // the quad holding the stream's first byte
    global const uint4* qp = (global const uint4*)src + qb;
    global const uint* wp = (global const uint*)qp;
    const uchar last = src[s0 + n - 1];       // not 0: the host checked
    int pos = 8 * (n - 1) + (31 - clz((uint)last));     // bits not yet read
    int r = pos + (int)(s0 & 15) * 8;         // the same position, from bit 0 of quad qp[0]
    const int hi = (r - 1) >> 5;
    int lo = (hi - 1) * 32;                   // acc holds bits [lo, lo + 64) from qp[0]'s bit 0
    ulong acc = ((ulong)wp[max(hi, -4 * qb)] << 32) | wp[max(hi - 1, -4 * qb)];
    const int nw = hi - 2;                    // the next word the window takes
    int k = (nw & 3) + 1;                     // words of cur still to take (components k-1 .. 0)
    int nq = (nw >> 2) - 2;                   // the quad loaded after nxt
    uint4 cur = HUF_QUAD(nw >> 2), nxt = HUF_QUAD((nw >> 2) - 1);
    const uint mask = (1u << log) - 1;
    long i = 0;
    uchar a, b, c, d;
#if ZSTD_HUF_READER == 1
    // Four literals a step; one 4-byte store where this stream's output is aligned, else four.  No loop
    // first to reach alignment: the four streams of a block start at different alignments, and lanes
    // leaving such a loop at different times would run the main loop apart (one pass each, not together).
    const bool aligned = (((ulong)out) & 3) == 0;
    // While 48 bits or more are left, four symbols need no checks (HUF_SYM_FAST): most of a stream.
    const int off = r - pos;
    for (; ZSTD_HUF_FAST && i + 4 <= dlen && r - off >= 48; i += 4) {
        HUF_SYM_FAST(a); HUF_SYM_FAST(b); HUF_SYM_FAST(c); HUF_SYM_FAST(d);
        if (aligned) {
            *(global uint*)(out + i) = (uint)a | (uint)b << 8 | (uint)c << 16 | (uint)d << 24;
        } else {
            out[i] = a; out[i + 1] = b; out[i + 2] = c; out[i + 3] = d;
        }
    }
    pos = r - off;
    for (; i + 4 <= dlen; i += 4) {
        HUF_SYM(a); HUF_SYM(b); HUF_SYM(c); HUF_SYM(d);
        if (aligned) {
            *(global uint*)(out + i) = (uint)a | (uint)b << 8 | (uint)c << 16 | (uint)d << 24;
        } else {
            out[i] = a; out[i + 1] = b; out[i + 2] = c; out[i + 3] = d;
        }
    }
#endif
    for (; i < dlen; i++) { HUF_SYM(a); out[i] = a; }
    return pos != 0 ? E_LEFTOVER : 0;
}
#undef HUF_SYM
#undef HUF_SYM_FAST
#undef HUF_REFILL
#undef HUF_QUAD
#endif

// One work-group per block with Huffman literals (groups: its first stream row, its stream count): the
// group loads the block's table (the slot zstd_huf_trees filled for the tree the stream row names) into
// local memory, then one work-item per stream (1 or 4) decodes.  A refused tree (log 0) decodes nothing:
// its error is the block's.
kernel __attribute__((reqd_work_group_size(ZSTD_HUF_LANES, 1, 1)))
void zstd_huf_streams(global const uchar* src, global const long* streams, global const long* groups,
                      global const ushort* huf, global const int* trees, global uchar* lit, global uchar* out,
                      global int* err) {
#if ZSTD_HUF_LOCAL
    local ushort table[HUF_SLOT];
#endif
    const int lane = get_local_id(0);
    const long first = groups[2 * get_group_id(0)], count = groups[2 * get_group_id(0) + 1];
    global const long* row = streams + (first + min((long)lane, count - 1)) * STREAM_COLUMNS;
    global const ushort* t = huf + row[4] * HUF_SLOT;
    const int log = trees[row[4] * TREE_INFO];
    // zstd_huf_trees writes 0 (refused) or 1..12; checked anyway, so the local table's writes stay inside it
    const bool usable = log > 0 && log <= 12;
    const int size = usable ? 1 << log : 0;
#if ZSTD_HUF_LOCAL
    for (int k = lane; k < size; k += ZSTD_HUF_LANES) table[k] = t[k];
    barrier(CLK_LOCAL_MEM_FENCE);
#else
    global const ushort* table = t;
#endif
    // S_OUT (row[5]): the host found this block's output place and its literals are its output, within the
    // frame's: they go there, not to the literals (zstd_copy_blocks leaves the block alone)
    if (lane < count) err[first + lane] = usable ? huf_stream(src, row, log, table, row[5] ? out : lit) : 0;
}
#endif  // ZSTD_HUF_READER == 5 or 6

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

// ---- Sequence execution: blocks one work-group each, the matches that wait for earlier blocks after ----
//
// A block's output starts where the earlier blocks' decoded sizes add up to (raw and RLE blocks: their
// size; compressed ones: their literals and their sequences' match lengths), and its repeat offsets are
// what the frame's earlier sequences left (they carry from block to block).  Neither needs a byte of
// output, so these kernels run, in this order, after zstd_copy_blocks:
//   zstd_block_scan: one work-item per block after the copied prefix adds up its decoded size and reduces
//                    its sequences' effect on the three repeat offsets to a function of the three it
//                    starts with: each out is a constant or an incoming one less k, at least 1 (repeat
//                    offset 3 after no literals is offset 1 less 1, at least 1, and max(max(x - a, 1) - 1,
//                    1) = max(x - a - 1, 1), so the form is closed);
//   zstd_frame_scan: one work-group per frame checks the copied prefix (its lanes at once) and its first
//                    lane runs through the other blocks' sizes and functions, integers only: each block's
//                    output position and incoming repeat offsets;
//   zstd_blocks:     one work-group per block after the prefix: its first lane resolves the block's offsets,
//                    makes every check the frame's serial walk made of it and marks the matches that wait
//                    for earlier blocks; then the lanes copy all its literals, then the matches that do not
//                    wait, in order, and write the waiting matches' bytes' origins (below);
//   zstd_origin_jump (a few rounds), zstd_origin_gather: a work-item per 32 bytes of all frames, the
//                    waiting bytes' origins followed back across blocks, then the bytes copied;
//   zstd_execute:    one work-group per frame: the earliest failing block, the content size, the checksum
//                    (and, for a frame without origins, the waiting matches in order).
// What may run before what.  A block's output is literals 0, match 0, literals 1, match 1, ..., the last
// literals.  Literals come from the literal buffer (or the frame), never from the output, so they are all
// written first, at once.  Match i copies from off bytes before its start d: bytes before its own end,
// never a later sequence's literals (they lie after it), so writing the literals first changes nothing it
// reads.  Bytes past d it reads are its own (off < ml): byte k is byte k % off of the off bytes before d,
// so a match reads exactly [d - off, d - off + min(off, ml)), all before d, and its bytes go at once.
// A match waits when that range reaches before the block's start or holds a byte of a match that waits
// (a bit per byte, block_check); the others read only literals and earlier matches that do not wait, all
// written by zstd_blocks before them in order: running them before the waiting ones changes nothing they
// read, and a waiting match before one of them reads only bytes before its own end, which the later match
// does not write.
// Waiting matches.  Their bytes depend on earlier blocks, often through a chain of matches (in frames of
// integers or text almost every match of a block waits, each reading the one before it), so instead of
// copying them in order, zstd_blocks follows each chain within the block: a waiting byte's origin is the
// byte it copies, or that byte's origin when it is a waiting byte too, so every origin is a byte of an
// earlier block or one of the block's bytes no waiting match writes (final once zstd_blocks is done).
// zstd_origin_jump then replaces an origin that is a waiting byte (of an earlier block) by that byte's
// origin, in rounds (pointer jumping: each step goes back a block at least, each round at least halves
// what is left of a chain), until every origin is a byte no waiting match writes; zstd_origin_gather
// copies every waiting byte of every frame from its origin, all at once (it reads only final bytes and
// writes only waiting ones).  A frame with a block that decodes past DEP_BITS bytes (libzstd allows it
// where the literals lie in the block: the frame's output bounds it), or a call of 4 GiB or more (origins
// are uint positions), has no origins: zstd_execute runs its waiting matches in order (block_matches),
// block after block, the bytes they read being final as above.
// Copied-prefix blocks were written by zstd_copy_blocks, before all this.
// Errors.  A block's checks read its position and incoming repeat offsets; up to the first block the
// serial walk refuses, those are the walk's (only earlier blocks, all valid, make them), so each block's
// (code, detail) is the walk's and the frame's error is the earliest failing block's.  Blocks after it may
// get any position or offsets: their own checks still bound every write by the frame's output, and a
// position outside the output is refused before anything is written.

#define ST_SIZE 0          // per-block state (zstd_decode.py's STATE_COLUMNS): decoded size,
#define ST_F 1             // the repeat-offset functions (3),
#define ST_POS 4           // output position,
#define ST_REP 5           // incoming repeat offsets (3),
#define ST_SPLIT 8         // matches run in zstd_blocks (the rest in zstd_execute),
#define ST_CODE 9          // error code and its detail,
#define ST_DETAIL 10
#define STATE_COLUMNS 11
#define FS_CODE 0          // per-frame state (FSTATE_COLUMNS): the copied prefix's error (code, block, detail),
#define FS_WHERE 1
#define FS_DETAIL 2
#define FS_TOTAL 3         // the decoded size the blocks add up to, the copied prefix's block count
#define FS_NPRE 4
#define FS_ORG 5           // where the frame's bytes start in org and wait (the host's; a multiple of 32)
#define FS_SERIAL 6        // whether the frame's waiting matches run in order in zstd_execute (no origins)
#define FSTATE_COLUMNS 7

#define DEP_BITS (BLOCK_MAX + 64)   // bytes of a block whose waiting (block_check) is tracked
#define DEP_WORDS (DEP_BITS / 32)

#ifndef ZSTD_SHORT_MATCH
#define ZSTD_SHORT_MATCH 16   // matches up to this long are copied by the first lane alone (no barrier)
#endif

// A repeat-offset function: (s << 32) | v: incoming offset s less v (at least 1), or the constant v (s 3).
#define REP_CONST 3L

inline long rep_less(long f) {          // the function of offset 1 less 1, at least 1
    if ((f >> 32) == REP_CONST) {
        uint t = (uint)f - 1;
        t += t == 0;
        return REP_CONST << 32 | t;
    }
    return f + 1;
}

inline uint rep_apply(long f, uint r0, uint r1, uint r2) {
    const uint v = (uint)f;
    const long s = f >> 32;
    if (s == REP_CONST) return v;
    const uint r = s == 0 ? r0 : s == 1 ? r1 : r2;
    return r > v ? r - v : 1;
}

// One work-item per block of which[] (those after the copied prefix): state's ST_SIZE and ST_F.
kernel void zstd_block_scan(global const long* blocks, global const long* which, global const uint4* seqs,
                            global long* state, uint count) {
    const uint g = get_global_id(0);
    if (g >= count) return;
    const long b = which[g];
    global const long* row = blocks + b * BLOCK_COLUMNS;
    long n = row[B_SIZE], f0 = 0, f1 = 1L << 32, f2 = 2L << 32;
    if (row[B_TYPE] == 2) {
        n = row[B_LITLEN];
        global const uint4* sq = seqs + row[B_SEQ];
        const long nseq = row[B_NSEQ];
        for (long i = 0; i < nseq; i++) {
            const uint4 s = sq[i];
            n += s.y;                               // (the literal lengths are in B_LITLEN)
            if (s.w == 0) {                         // a new offset
                f2 = f1; f1 = f0; f0 = REP_CONST << 32 | s.z;
            } else if (s.w == 1) {                  // repeat offset 1, or 2 (swapped with 1)
                if (s.z) { long t = f0; f0 = f1; f1 = t; }
            } else {                                // repeat offset 2, 3 or 1 less 1
                long t = s.z == 3 ? rep_less(f0) : s.z == 1 ? f1 : f2;
                if (s.z != 1) f2 = f1;
                f1 = f0;
                f0 = t;
            }
        }
    }
    global long* st = state + b * STATE_COLUMNS;
    st[ST_SIZE] = n;
    st[ST_F] = f0;
    st[ST_F + 1] = f1;
    st[ST_F + 2] = f2;
}

// One work-group per frame: the copied prefix's blocks are checked by the lanes at once (each a strided
// subset, the earliest failing block by a local minimum, no barrier per block), then the first lane gives
// every later block its position and incoming repeat offsets.  fstate gets the prefix's error, the total
// size and the prefix's length.
kernel __attribute__((reqd_work_group_size(ZSTD_LANES, 1, 1)))
void zstd_frame_scan(global const long* blocks, global const long* frames, global long* state,
                     global long* fstate) {
    local int npre, bad;
    const int lane = get_local_id(0);
    const long f = get_group_id(0);
    global const long* fr = frames + f * FRAME_COLUMNS;
    const long size = fr[1], first = fr[2], nblocks = fr[3];
    if (lane == 0) { npre = (int)nblocks; bad = (int)nblocks; }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (long k = lane; k < nblocks; k += ZSTD_LANES) {
        global const long* row = blocks + (first + k) * BLOCK_COLUMNS;
        long d;
        if (row[B_PRE] < 0) { atomic_min(&npre, (int)k); break; }     // the prefix ends before k
        if (prefix_check(row, size, &d)) { atomic_min(&bad, (int)k); break; }   // (later ones lose)
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lane) return;
    long pos = 0, detail = 0, where = 0;
    int code = 0;
    global long* fs = fstate + f * FSTATE_COLUMNS;
    // origins need every byte of a block in its bitmap (a block past DEP_BITS: libzstd allows it where the
    // literals lie in the block, the frame's output bounding it) and positions in a uint (the host's part)
    long serial = fs[FS_SERIAL];
    if (bad < npre) {       // (a failing block is a prefix block: npre, maybe not found then, is past it)
        global const long* row = blocks + (first + bad) * BLOCK_COLUMNS;
        code = prefix_check(row, size, &detail);
        where = row[B_INDEX];
    } else {
        if (npre > 0) {
            global const long* row = blocks + (first + npre - 1) * BLOCK_COLUMNS;
            pos = row[B_PRE] + block_out(row);
        }
        uint r0 = 1, r1 = 4, r2 = 8;
        for (long b = first + npre; b < first + nblocks; b++) {
            global long* st = state + b * STATE_COLUMNS;
            serial |= st[ST_SIZE] > DEP_BITS;
            st[ST_POS] = pos;
            st[ST_REP] = r0;
            st[ST_REP + 1] = r1;
            st[ST_REP + 2] = r2;
            pos += st[ST_SIZE];
            const uint n0 = rep_apply(st[ST_F], r0, r1, r2), n1 = rep_apply(st[ST_F + 1], r0, r1, r2);
            r2 = rep_apply(st[ST_F + 2], r0, r1, r2);
            r0 = n0;
            r1 = n1;
        }
    }
    fs[FS_SERIAL] = serial;
    fs[FS_CODE] = code;
    fs[FS_WHERE] = where;
    fs[FS_DETAIL] = detail;
    fs[FS_TOTAL] = pos;
    fs[FS_NPRE] = npre;
}

// Which matches wait for earlier blocks: a bit per byte of the block's output (dep), set over the output of
// every match that reads bytes before the block or bytes with the bit set; bytes past DEP_BITS (a block
// that decodes to more than 128 KiB + 64, which libzstd may allow) count as set (so such a match waits).

inline uint dep_mask(long w, long a, long b) {      // word w's bits of bytes [a, b)
    uint m = ~0u;
    if (w == a >> 5) m &= ~0u << (a & 31);
    if (w == (b - 1) >> 5) m &= ~0u >> (31 - ((b - 1) & 31));
    return m;
}

inline bool dep_any(local const uint* dep, long a, long b) {
    if (b <= a) return false;
    if (a < 0 || b > DEP_BITS) return true;
    for (long w = a >> 5; w <= (b - 1) >> 5; w++)
        if (dep[w] & dep_mask(w, a, b)) return true;
    return false;
}

inline void dep_set(local uint* dep, long a, long b) {
    b = min(b, (long)DEP_BITS);
    for (long w = a >> 5; w <= (b - 1) >> 5 && a < b; w++) dep[w] |= dep_mask(w, a, b);
}

// The serial walk's checks of a block after the copied prefix at pos, its sequences' offsets resolved from
// its incoming repeat offsets: each row becomes (literal length, match length, offset, whether the match
// waits for earlier blocks).  Returns the code or 0; *split: the first match that waits (nseq if none).
// dep: DEP_WORDS zeros.
int block_check(global const long* row, long size, long pos, global const long* st, global uint4* seqs,
                local uint* dep, long* detail, long* split) {
    long limit = 0;
    const long nseq = row[B_TYPE] == 2 ? row[B_NSEQ] : 0;
    *split = nseq;
    // a position outside the output comes only after a failing block (a valid one ends within the output)
    if (pos < 0 || pos > size) { *detail = pos; return E_SIZE; }
    int code = block_head(row, size, pos, &limit, detail);
    if (code || row[B_TYPE] != 2) return code;
    uint rep0 = (uint)st[ST_REP], rep1 = (uint)st[ST_REP + 1], rep2 = (uint)st[ST_REP + 2];
    const long litlen = row[B_LITLEN];
    global uint4* sq = seqs + row[B_SEQ];
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
            const uint t = idx == 3 ? rep0 - 1 : idx == 1 ? rep1 : rep2;     // (0 is refused below)
            if (idx != 1) rep2 = rep1;
            rep1 = rep0;
            rep0 = t;
            off = t;
        }
        if (ll + ml > limit - bpos) { *detail = i; return E_SEQ_PAST; }
        if (ll > litlen - lused) { *detail = i; return E_LIT_PAST; }
        if ((long)off > pos + bpos + ll) { *detail = i; return E_OFFSET; }
        // RFC 8878 forbids an offset of 0; libzstd up to 1.5.5 took it as 1, later ones (and zarr's numcodecs)
        // refuse the frame (zstd's doc/decompressor_permissive.md), and so does this decoder
        if (off == 0) { *detail = i; return E_ZERO_OFFSET; }
        // byte k of the match is byte k % off of the off bytes before it (block_matches): those are what it reads
        const long d = bpos + ll;
        const uint waits = dep_any(dep, d - (long)off, d - (long)off + min((long)off, ml));
        if (waits) {
            dep_set(dep, d, d + ml);
            if (*split == nseq) *split = i;
        }
        sq[i] = (uint4)(s.x, s.y, off, waits);
        bpos += ll + ml;
        lused += ll;
    }
    const long rest = litlen - lused;
    if (rest > limit - bpos) { *detail = rest; return E_LAST_PAST; }
    return 0;
}

// Every literal of a compressed block (bo: its output), the group's lanes sharing each copy, no barrier.
inline void block_literals(global const long* row, global const uchar* src, global const uchar* lit,
                           global const uint4* seqs, global uchar* bo, int lane) {
    const long kind = row[B_LITKIND], nseq = row[B_NSEQ];
    global const uchar* lsrc = kind == LIT_HUF ? lit + row[B_LITOFF] : src + row[B_LITOFF];
    const uchar rle = (uchar)row[B_LITOFF];
    global const uint4* sq = seqs + row[B_SEQ];
    long bpos = 0, lused = 0;
    for (long i = 0; i < nseq; i++) {
        const uint4 s = sq[i];
        const long ll = s.x;
        if (kind == 2)
            group_fill(bo + bpos, rle, ll, lane);
        else
            group_copy(bo + bpos, lsrc + lused, ll, lane);
        bpos += ll + s.y;
        lused += ll;
    }
    const long rest = row[B_LITLEN] - lused;
    if (kind == 2)
        group_fill(bo + bpos, rle, rest, lane);
    else
        group_copy(bo + bpos, lsrc + lused, rest, lane);
}

// The matches of a compressed block that wait for earlier blocks (waits 1) or not (0), from sequence from
// on, in order (offsets resolved by block_check); its literals are written.  A match copies byte k from byte
// k % off of the off bytes before it (its own earlier bytes repeat them), so every byte it reads is final
// when it starts and its bytes go at once.  A short one is the first lane's alone; a barrier before a long
// one makes the first lane's bytes visible to the others, one after it makes its bytes visible to
// whichever lane reads them next.
void block_matches(global const long* row, global const uint4* seqs, global uchar* bo, long from, uint waits,
                   int lane) {
    global const uint4* sq = seqs + row[B_SEQ];
    const long nseq = row[B_NSEQ];
    long bpos = 0;
    for (long i = 0; i < nseq; i++) {
        const uint4 s = sq[i];
        const long ll = s.x, ml = s.y;
        const uint off = s.z;
        global uchar* d = bo + bpos + ll;
        global const uchar* m = d - off;
        bpos += ll + ml;
        if (i < from || s.w != waits) continue;
        if (ZSTD_LANES > 1 && ml <= ZSTD_SHORT_MATCH) {
            if (lane == 0) {
                uchar t[ZSTD_SHORT_MATCH];           // read all, then write (the reads are before d)
                for (long k = 0; k < ml; k++) t[k] = m[(uint)k % off];
                for (long k = 0; k < ml; k++) d[k] = t[k];
            }
            continue;
        }
        SYNC();
        if ((long)off >= ml)
            group_copy(d, m, ml, lane);
        else
            for (long k = lane; k < ml; k += ZSTD_LANES) d[k] = m[(uint)k % off];
        SYNC();
    }
}

inline bool dep_bit(local const uint* dep, long x) { return (dep[x >> 5] >> (x & 31)) & 1; }

// Where byte x of the block at pos (x < 0: of an earlier block) comes from, as a position in org: a byte
// of an earlier block, or of the block's own that no waiting match writes, through the origins of the
// block's waiting bytes.
inline uint origin(local const uint* dep, global const uint* org, long pos, long x) {
    return (uint)(x >= 0 && dep_bit(dep, x) ? org[pos + x] : pos + x);
}

// The origins (org, by frame position) of the bytes of a block's waiting matches, in order: byte k of a
// match is byte k % off of the off bytes before it (as block_matches copies), so its origin is that
// byte's.  No output byte is read: this runs in zstd_blocks, and zstd_execute then only gathers each
// waiting byte from its origin, the block's bytes at once.  Barriers as block_matches' (an origin reads
// earlier origins as a match reads earlier bytes).  dep: the block's waiting bytes (block_check's).
void block_origins(global const long* row, global const uint4* seqs, local const uint* dep, global uint* org,
                   long pos, int lane) {
    global const uint4* sq = seqs + row[B_SEQ];
    const long nseq = row[B_NSEQ];
    long bpos = 0;
    for (long i = 0; i < nseq; i++) {
        const uint4 s = sq[i];
        const long ll = s.x, ml = s.y;
        const uint off = s.z;
        const long d = bpos + ll;
        bpos += ll + ml;
        if (!s.w) continue;
        if (ZSTD_LANES > 1 && ml <= ZSTD_SHORT_MATCH) {
            if (lane == 0)
                for (long k = 0; k < ml; k++) org[pos + d + k] = origin(dep, org, pos, d - off + (uint)k % off);
            continue;
        }
        SYNC();
        for (long k = lane; k < ml; k += ZSTD_LANES) org[pos + d + k] = origin(dep, org, pos, d - off + (uint)k % off);
        SYNC();
    }
}

// One work-group per block of which[] (those after the copied prefix): checked by the first lane
// (block_check: state's ST_SPLIT, ST_CODE, ST_DETAIL), then, unless refused, copied: a raw or RLE block,
// or a compressed block's literals and its matches before ST_SPLIT.
kernel __attribute__((reqd_work_group_size(ZSTD_LANES, 1, 1)))
void zstd_blocks(global const uchar* src, global const long* blocks, global const long* which,
                 global const long* frames, global const uchar* lit, global uint4* seqs, global long* state,
                 global const long* fstate, global uint* org, global uint* wait, global uchar* out) {
    local long shared[2];
    local uint dep[DEP_WORDS];
    const int lane = get_local_id(0);
    const long b = which[get_group_id(0)];
    global const long* row = blocks + b * BLOCK_COLUMNS;
    global long* st = state + b * STATE_COLUMNS;
    global const long* fr = frames + row[1] * FRAME_COLUMNS;
    const long pos = st[ST_POS];
    for (int w = lane; w < DEP_WORDS; w += ZSTD_LANES) dep[w] = 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lane == 0) {
        long detail = 0, split = 0;
        const int code = block_check(row, fr[1], pos, st, seqs, dep, &detail, &split);
        st[ST_SPLIT] = split;
        st[ST_CODE] = code;
        st[ST_DETAIL] = detail;
        shared[0] = code;
        shared[1] = split;
    }
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);   // the resolved offsets too
    if (shared[0]) return;
    const long split = shared[1], type = row[B_TYPE];
    global uchar* bo = out + fr[0] + pos;
    if (type == RAW) {
        group_copy(bo, src + row[B_SRC], row[B_SIZE], lane);
    } else if (type == RLE) {
        group_fill(bo, src[row[B_SRC]], row[B_SIZE], lane);
    } else {
        block_literals(row, src, lit, seqs, bo, lane);
        SYNC();             // matches read literals other lanes wrote
        block_matches(row, seqs, bo, 0, 0, lane);
        global const long* fs = fstate + row[1] * FSTATE_COLUMNS;
        if (split < row[B_NSEQ] && !fs[FS_SERIAL]) {
            const long at = fs[FS_ORG] + pos;           // the block's first byte in org and wait
            block_origins(row, seqs, dep, org, at, lane);
            // its waiting bytes into the call's bitmap (words shared with the blocks around it: atomic)
            const long bytes = min(st[ST_SIZE], (long)DEP_BITS);
            for (long w = lane; w < (bytes + 31) / 32; w += ZSTD_LANES) {
                const uint bits = dep[w];
                if (!bits) continue;
                const long g = at + 32 * w;         // the word's first bit in wait
                const int sh = (int)(g & 31);
                atomic_or(wait + (g >> 5), bits << sh);
                if (sh) atomic_or(wait + (g >> 5) + 1, bits >> (32 - sh));
            }
        }
    }
}

// One work-item per word of wait (32 bytes of the call's frames): each waiting byte's origin is followed,
// while it is a waiting byte too (of an earlier block: a block's own origins are followed already), to a
// byte that no waiting match writes, in one launch: a chain goes back a block or more each step, so it
// ends.  Other work-items shorten the same chains meanwhile; any origin read, old or new, is a byte of the
// chain, so following it stays right whatever the order (on PoCL the words go last first, as on a device
// that runs them in another order).  One launch, not a round per halving: each launch of a decode call
// waits for the GEMM kernel running beside it.
kernel void zstd_origin_jump(global const uint* wait, global uint* org, ulong words) {
    if (get_global_id(0) >= words) return;
    const ulong w = words - 1 - get_global_id(0);       // (the last word first: as zstd_origin_gather)
    uint bits = wait[w];
    while (bits) {
        const int j = popcount((bits & (0u - bits)) - 1u);     // the lowest bit set
        bits &= bits - 1;
        const ulong g = w * 32 + j;
        uint q = org[g];
        while ((wait[q >> 5] >> (q & 31)) & 1) q = org[q];
        org[g] = q;
    }
}

// One work-item per word of wait: each waiting byte copied from its origin (a byte final since
// zstd_blocks, which zstd_origin_jump made sure of), all at once.  Frames start at multiples of 32 in
// wait (FS_ORG), so a word is one frame's, found by a binary search.  The last word first: the order is
// free, and where a device runs work-items in order (PoCL), an origin left on a waiting byte would be
// read before that byte is copied, which the tests see.
kernel void zstd_origin_gather(global const uint* wait, global const uint* org, global const long* frames,
                               global const long* fstate, global uchar* out, ulong words, uint nframes) {
    if (get_global_id(0) >= words) return;
    const ulong w = words - 1 - get_global_id(0);
    uint bits = wait[w];
    if (!bits) return;
    int lo = 0, hi = (int)nframes - 1;          // the last frame starting at or before the word
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (fstate[mid * FSTATE_COLUMNS + FS_ORG] <= (long)(w * 32)) lo = mid;
        else hi = mid - 1;
    }
    global uchar* o = out + frames[lo * FRAME_COLUMNS] - fstate[lo * FSTATE_COLUMNS + FS_ORG];
    while (bits) {
        const int j = popcount((bits & (0u - bits)) - 1u);     // the lowest bit set
        bits &= bits - 1;
        const ulong g = w * 32 + j;
        o[g] = o[org[g]];
    }
}

// One work-group per frame.  err gets (code, block, detail) per frame: the copied prefix's error, else
// the earliest failing later block's (its lanes at once, a local minimum), else the content size's or the
// checksum's.  Before the failing block, every block's matches from its ST_SPLIT on run here, in order.
kernel __attribute__((reqd_work_group_size(ZSTD_LANES, 1, 1)))
void zstd_execute(global const long* blocks, global const long* frames, global const uint4* seqs,
                  global const long* state, global const long* fstate, global uchar* out, global long* err) {
    local int bad;
    const int lane = get_local_id(0);
    const long f = get_group_id(0);
    global const long* fr = frames + f * FRAME_COLUMNS;
    global const long* fs = fstate + f * FSTATE_COLUMNS;
    global uchar* o = out + fr[0];
    const long size = fr[1], first = fr[2], nblocks = fr[3], npre = fs[FS_NPRE];
    int code = (int)fs[FS_CODE];
    long where = fs[FS_WHERE], detail = fs[FS_DETAIL];
    if (lane == 0) bad = (int)nblocks;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!code) {
        for (long k = npre + lane; k < nblocks; k += ZSTD_LANES) {
            if (state[(first + k) * STATE_COLUMNS + ST_CODE]) { atomic_min(&bad, (int)k); break; }
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const long stop = bad;
    if (!code) {
        for (long k = npre; k < stop; k++) {
            global const long* row = blocks + (first + k) * BLOCK_COLUMNS;
            global const long* st = state + (first + k) * STATE_COLUMNS;
            if (row[B_TYPE] == 2 && st[ST_SPLIT] < row[B_NSEQ] && fs[FS_SERIAL])
                block_matches(row, seqs, o + st[ST_POS], st[ST_SPLIT], 1, lane);
        }
        if (stop < nblocks) {
            global const long* st = state + (first + stop) * STATE_COLUMNS;
            code = (int)st[ST_CODE];
            where = blocks[(first + stop) * BLOCK_COLUMNS + B_INDEX];
            detail = st[ST_DETAIL];
        } else if (fs[FS_TOTAL] != size) {
            code = E_SIZE;
            detail = fs[FS_TOTAL];
            where = -1;
        }
    }
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

// ---- The plan on the device: zstd_fastplan's rows, made here --------------------------------------------
// A work-group a frame.  Its first lane walks the block headers (each says where the next one is); the lanes
// then read each compressed block's literal section at once; the first lane runs through the blocks in order
// (literal offsets, tree rows, prefix positions); the lanes write the stream rows.  The rows are exactly
// zstd_fastplan's (tests compare them frame by frame), offsets relative to the frame; a block whose sequence
// section is more than its one 0 byte gets B_NSEQ -1 and B_SSRC the section's start, for the host to read
// (zstd_frames._sequences).  Where zstd_fastplan would give up (it reads the frame block by block then, with
// its errors) the frame's status is 1 and its rows are not to be read.
// Frame rows in (PLAN_COLUMNS): where the frame starts in src, its size, its header's size, its checksum flag,
// its first block slot, its slots (the most blocks it may have); out (PLAN_OUT): status, blocks, trees,
// literals.  The out rows, then the block, stream and tree rows (from the given offsets, in longs), share one
// buffer, so that the host reads them back in one blocking read, not four.
#define PLAN_COLUMNS 6
#define PLAN_OUT 4
#define PLAN_SCRATCH 3      // per block slot: a tree of its own (1), libzstd's x2 choice for it, its tree row
#ifndef ZSTD_PLAN_LANES
#define ZSTD_PLAN_LANES 64
#endif
#define TREE_COLUMNS_ 3
#define LIMIT_PLACED_ 1
constant short PLAN_ALGO[16][4] = {
    {0, 0, 1, 1}, {0, 0, 1, 1}, {150, 216, 381, 119}, {170, 205, 514, 112}, {177, 199, 539, 110},
    {197, 194, 644, 107}, {221, 192, 735, 107}, {256, 189, 881, 106}, {359, 188, 1167, 109},
    {582, 187, 1570, 114}, {688, 187, 1712, 122}, {825, 186, 1965, 136}, {976, 185, 2131, 150},
    {1180, 186, 2070, 175}, {1377, 185, 1731, 202}, {1412, 185, 1695, 202}};

kernel __attribute__((reqd_work_group_size(ZSTD_PLAN_LANES, 1, 1)))
void zstd_plan(global const uchar* src, global const long* frames, global long* rows, const long at_blocks,
               const long at_streams, const long at_trees, global long* scratch) {
    global long* fout = rows;
    global long* blocks = rows + at_blocks;
    global long* streams = rows + at_streams;
    global long* trees = rows + at_trees;
    local int nb, ok;
    const int lane = get_local_id(0);
    const long f = get_group_id(0);
    global const long* fr = frames + f * PLAN_COLUMNS;
    const long s0 = fr[0], end = fr[0] + fr[1], base = fr[4], most = fr[5];
    global long* bl = blocks + base * BLOCK_COLUMNS;
    if (lane == 0) {            // the one serial part
        long pos = s0 + fr[2];
        int n = 0, good = 1;
        for (;;) {
            if (n >= most || end - pos < 3) { good = 0; break; }
            const uint h = src[pos] | (uint)src[pos + 1] << 8 | (uint)src[pos + 2] << 16;
            const uint btype = (h >> 1) & 3;
            if (btype == 3) { good = 0; break; }
            pos += 3;
            const long csize = btype == RLE ? 1 : h >> 3;
            if (csize > end - pos) { good = 0; break; }
            global long* row = bl + n * BLOCK_COLUMNS;
            for (int c = 0; c < BLOCK_COLUMNS; c++) row[c] = 0;
            row[B_TYPE] = btype;
            row[B_SRC] = pos - s0;
            row[B_SIZE] = h >> 3;
            row[B_INDEX] = n;
            n++;
            pos += csize;
            if (h & 1) break;
        }
        nb = n;
        ok = good && pos + (fr[3] ? 4 : 0) == end;
    }
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    const int count = ok ? nb : 0;
    for (int b = lane; b < count; b += ZSTD_PLAN_LANES) {     // each compressed block's literal section
        global long* row = bl + b * BLOCK_COLUMNS;
        global long* sc = scratch + (base + b) * PLAN_SCRATCH;
        if (row[B_TYPE] != 2) { sc[0] = 0; continue; }
        const long p = s0 + row[B_SRC], bs = row[B_SIZE];
        int bad = bs > BLOCK_MAX || bs < 5;
        const uint b0 = bad ? 0 : src[p];
        const uint ltype = b0 & 3, lhl = (b0 >> 2) & 3;
        bad |= ltype < 2 || lhl == 0;       // raw, RLE or single-stream literals
        const uint lhc = bad ? 0 : src[p] | (uint)src[p + 1] << 8 | (uint)src[p + 2] << 16 | (uint)src[p + 3] << 24;
        const long lh = lhl == 1 ? 3 : lhl == 2 ? 4 : 5;
        const long lit = lhl == 1 ? (lhc >> 4) & 0x3FF : lhl == 2 ? (lhc >> 4) & 0x3FFF : (lhc >> 4) & 0x3FFFF;
        const long clit = lhl == 1 ? (lhc >> 14) & 0x3FF : lhl == 2 ? (long)(lhc >> 18)
                        : (long)(lhc >> 22) + (bad ? 0 : (long)src[p + 4] << 10);
        bad |= lit > BLOCK_MAX || lit < 6 || clit + lh > bs || clit == 0;
        const long at = p + lh, stop = at + clit;
        const int fresh = ltype == 2;
        const uint head = bad ? 0 : src[at];
        const long used = head >= 128 ? (head - 127 + 1) / 2 + 1 : head + 1;
        bad |= fresh && used >= clit;
        const long first = at + (fresh ? used : 0);
        bad |= stop - first < 10;
        long len[4] = {0, 0, 0, 0};
        if (!bad) {
            len[0] = src[first] | (long)src[first + 1] << 8;
            len[1] = src[first + 2] | (long)src[first + 3] << 8;
            len[2] = src[first + 4] | (long)src[first + 5] << 8;
            len[3] = stop - first - (len[0] + len[1] + len[2] + 6);
        }
        const long seg = (lit + 3) / 4;
        bad |= len[3] < 0 || 3 * seg > lit;
        long from = first + 6;
        for (int k = 0; k < 4; k++) {
            bad |= len[k] < 1 || (!bad && src[from + len[k] - 1] == 0);
            global long* s = streams + (4 * (base + b) + k) * STREAM_COLUMNS;
            s[0] = from - s0;
            s[1] = len[k];
            s[2] = seg * k;                     // (the block's literal offset added below)
            s[3] = k < 3 ? seg : lit - 3 * seg;
            s[5] = 0;
            s[7] = b;
            from += len[k];
        }
        // libzstd's choice of Huffman decoder, made where each tree is read (zstd_fastplan's x2)
        const int q = clit >= lit ? 15 : (int)(clit * 16 / max(lit, 1L));
        const long d256 = lit >> 8;
        const long t0 = PLAN_ALGO[q][0] + PLAN_ALGO[q][1] * d256, t1 = PLAN_ALGO[q][2] + PLAN_ALGO[q][3] * d256;
        sc[0] = fresh;
        sc[1] = (t1 + (t1 >> 5)) < t0;
        row[B_LITKIND] = LIT_HUF;
        row[B_LITLEN] = lit;
        row[B_LIMIT] = LIMIT_PLACED_;
        // the sequences section: most blocks hold none (one byte, 0, ending the block)
        const long seq = stop;
        if (!bad && (seq + 1 != p + bs || src[min(seq, end - 1)] != 0)) {
            row[B_NSEQ] = -1;
            row[B_SSRC] = seq - s0;
        }
        row[B_SLEN] = at - s0;          // (the tree's place, read below; the host's rows have 0 here)
        row[B_LOGS] = used;
        if (bad) ok = 0;
    }
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    if (lane == 0 && ok) {      // in order: literal offsets, tree rows, prefix positions
        long lits = 0, pre = 0, tree = -1;
        int known = 1, any = 0;
        for (int b = 0; b < nb; b++) {
            global long* row = bl + b * BLOCK_COLUMNS;
            global long* sc = scratch + (base + b) * PLAN_SCRATCH;
            const int comp = row[B_TYPE] == 2;
            if (comp) {
                if (!any && !sc[0]) { ok = 0; break; }     // treeless literals with no tree before them
                any = 1;
                if (sc[0]) {
                    tree++;
                    global long* t = trees + (base + tree) * TREE_COLUMNS_;
                    t[0] = row[B_SLEN];
                    t[1] = row[B_LOGS];
                    t[2] = b;
                }
                sc[2] = tree;
                row[B_LITOFF] = lits;
                lits += row[B_LITLEN];
                row[B_SLEN] = 0;
                row[B_LOGS] = 0;
            }
            known &= !comp || row[B_NSEQ] == 0;
            row[B_PRE] = known ? pre : -1;
            pre += comp ? row[B_LITLEN] : row[B_SIZE];
        }
        fout[f * PLAN_OUT + 2] = tree + 1;
        fout[f * PLAN_OUT + 3] = lits;
    }
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    for (int b = lane; b < count && ok; b += ZSTD_PLAN_LANES) {   // each stream's literal offset and tree
        global const long* row = bl + b * BLOCK_COLUMNS;
        if (row[B_TYPE] != 2) continue;
        const long tree = scratch[(base + b) * PLAN_SCRATCH + 2];
        const long owner = trees[(base + tree) * TREE_COLUMNS_ + 2];
        const long x2 = scratch[(base + owner) * PLAN_SCRATCH + 1];
        for (int k = 0; k < 4; k++) {
            global long* s = streams + (4 * (base + b) + k) * STREAM_COLUMNS;
            s[2] += row[B_LITOFF];
            s[4] = tree;
            s[6] = x2;
        }
    }
    if (lane == 0) {
        fout[f * PLAN_OUT] = ok ? 0 : 1;
        fout[f * PLAN_OUT + 1] = nb;
    }
}
