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
// where c-blosc refuses it, with two exceptions, both streams no LZ4 encoder
// writes: a match offset of 0, which the format calls invalid and lz4's
// decoder lets through (it writes bytes of its own choosing); and a block
// that breaks the format's end conditions (a match starting in the output's
// last 12 bytes or ending in its last 5) where lz4's fast paths skip those
// checks (its shortcut for short sequences, and its fast loop on x86-64 and
// some ARM builds only: lz4 itself answers differently by platform).  The
// format lets a decoder refuse such a block (doc/lz4_Block_format.md, "End
// of block conditions"); here it is an error.
//
// Parameters (#ifndef, like the GEMM kernels'):
//   LZ4_WG  lanes per stream (the work-group size).  All lanes walk the
//           sequences together (the same loads, so the same decisions, and
//           no barrier to share them); literal and match bytes are copied
//           lane-parallel.  A match reads output bytes other lanes wrote, so
//           a barrier precedes a match whose source was written since the
//           last one.  1 (no barriers at all) suits a CPU device.
//   LZ4_MODE  how a compressed stream's work is split among the lanes:
//           0  lockstep (above): every lane parses every sequence, so each
//              sequence costs the latency of its dependent loads and of its
//              match's read, however short the copies.
//           1  token table: one lane (lane 0) parses LZ4_BATCH sequences into
//              a table in local memory, then the lanes copy them: each
//              literal and each match whose source lies before the batch
//              (written already) by one lane each, so the copies of many
//              sequences are in flight at once, and long ones by all copying
//              lanes together; the matches that read the batch's own output
//              follow in order, in groups that read nothing written since the
//              last barrier.  The table has two slots: lane 0 parses the next
//              batch while the others copy this one.  Suits streams of many
//              short matches (the exponent planes of shuffled floats).
//   LZ4_BATCH  sequences per table (mode 1).
//   LZ4_LONG   literals and matches longer than this many bytes are copied by
//           all copying lanes together, shorter ones by one lane (mode 1).
//   LZ4_COPY_FROM  the first copying lane (mode 1): lanes below it are left to
//           the parser.  32 (a warp) when there are 64 lanes or more, so that
//           the parsing lane's warp does not hold up the copying ones; 0 (the
//           parser copies too, after parsing) below.
//   LZ4_UNSHUFFLE  how unshuffle_blocks undoes a byte shuffle: 0, a work-item
//           per output byte (its element's bytes come from typesize planes);
//           1, a work-item per element: each plane's bytes read coalesced, and
//           a 4- or 8-byte element written as one word where it is aligned;
//           2, four elements a work-item where the elements are 4 or 8 bytes,
//           their planes' starts 4-byte aligned and the block 16-byte aligned
//           (a word read from each plane, 16 bytes written a time), else as 1.
//   LZ4_STAGE  bytes of the compressed stream staged in local memory for the
//           parser (mode 1; 0: it reads global memory, through the cache):
//           while the parser works on one batch, every lane loads the window
//           the next batch starts in, coalesced, so the parser's dependent
//           loads are local ones, and the cache misses of a lone lane walking
//           the stream go away.  Past the window the parser reads global memory.
//   LZ4_PARSE  the token table's parser (mode 1).  0: lane 0 parses each
//           sequence whole, each byte loaded when the rules reach it.  2,
//           wide: lane 0 only walks the tokens (where each sequence starts),
//           a batch ahead, while the copying lanes copy the batch before; then
//           every lane reads one sequence's lengths, offset and input-side
//           rules; a scan gives the output positions; every lane applies the
//           output-side rules to its sequences (the first to stop found by an
//           atomic minimum) and places its matches; lane 0 only groups phase
//           2's matches.  The profiler found parser 0 at about 160 one-lane
//           instructions a sequence, each waiting on the last (83 % of stall
//           samples; bench/NOTES.md, issue 28, ninth and tenth sessions).  Two
//           other parsers were measured slower than 2 and removed: a 16-byte
//           register window for parser 0's reads (f74ef3e), and 1, "lean" (parser
//           0 in 32 bits, a common sequence's bytes loaded at once; a6a2127).
#ifndef LZ4_WG
#define LZ4_WG 32
#endif
#ifndef LZ4_MODE
#define LZ4_MODE 0
#endif
#ifndef LZ4_BATCH
#define LZ4_BATCH 64
#endif
#ifndef LZ4_LONG
#define LZ4_LONG 32
#endif
#ifndef LZ4_STAGE
#define LZ4_STAGE 0
#endif
#ifndef LZ4_UNSHUFFLE
#define LZ4_UNSHUFFLE 0
#endif
#ifndef LZ4_PARSE
#define LZ4_PARSE 0
#endif
#ifndef LZ4_GROUP_LANE
#define LZ4_GROUP_LANE 0
#endif
#if LZ4_GROUP_LANE >= LZ4_WG
#error "LZ4_GROUP_LANE must be one of the work-group's lanes"
#endif
#if LZ4_PARSE == 2 && LZ4_STAGE > 0
#error "LZ4_PARSE 2 reads global memory: it has no staged window"
#endif
#ifndef LZ4_COPY_FROM
#if LZ4_WG >= 64
#define LZ4_COPY_FROM 32
#else
#define LZ4_COPY_FROM 0
#endif
#endif
#if LZ4_COPY_FROM >= LZ4_WG
#error "LZ4_COPY_FROM must leave copying lanes (below LZ4_WG)"
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
#if LZ4_MODE == 0
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
#endif  // LZ4_MODE == 0

#if LZ4_MODE == 1
// -- mode 1: the token table -------------------------------------------------------------------
// A slot of the table, LZ4_BATCH sequences, as uints in local memory: per
// sequence its literals' start in the input, their length, their start in the
// output, the match's offset and length (0: none), and what phase 1 does with
// the match; then the lists: dependent sequences (in order), their groups
// (first entry in that list; flags: a barrier first, one long match), and
// the long copies (2 t: sequence t's literals, 2 t + 1: its match).
#define T_LSRC 0
#define T_LLEN (1 * LZ4_BATCH)
#define T_OP (2 * LZ4_BATCH)
#define T_OFF (3 * LZ4_BATCH)
#define T_MLEN (4 * LZ4_BATCH)
#define T_SHORT (5 * LZ4_BATCH)       // 1: a match phase 1 copies on one lane
#define T_DEP (6 * LZ4_BATCH)
#define T_GFIRST (7 * LZ4_BATCH)
#define T_GFLAGS (8 * LZ4_BATCH)
#define T_LONG (9 * LZ4_BATCH)         // 2 LZ4_BATCH entries
#define T_WORDS (11 * LZ4_BATCH)
#define G_BARRIER 1
#define G_LONG 2
#define N_COPY (LZ4_WG - LZ4_COPY_FROM)
#define C_WORDS 5                      // per slot: sequences, long copies, dependent matches, groups, next ip

// All lanes stage the window the parser reads next (bytes past the row's end: zeros, never read).
#if LZ4_STAGE > 0
#define STAGE(from)                                                                   \
    wbase = (from);                                                                   \
    for (long i_ = lane; i_ < LZ4_STAGE; i_ += LZ4_WG) {                              \
        win[i_] = wbase + i_ < n_in ? in[wbase + i_] : 0;                             \
    }
#else
#define STAGE(from)
#endif

// One lane copies n bytes forward: from the input (literals), or from the
// output at `off` bytes back (a match: when off < n it repeats, reading bytes
// this lane has just written, which program order makes visible to it).
// Eight loads are issued before their stores, so one wait covers them.
static void copy_short(__global uchar* d, const __global uchar* s, const uint n, const uint off)
{
    if (off < n) {
        for (uint i = 0; i < n; i++) d[i] = s[i];
        return;
    }
    for (uint i = 0; i < n; i += 8) {
        uchar v[8];
#pragma unroll
        for (uint k = 0; k < 8; k++) v[k] = (i + k < n) ? s[i + k] : 0;
#pragma unroll
        for (uint k = 0; k < 8; k++) if (i + k < n) d[i + k] = v[k];
    }
}

// The parser's reads: from the staged window [wbase, wbase + LZ4_STAGE) where it holds the byte.
#if LZ4_STAGE > 0
#define IN_BYTE(i) ((ulong)((i) - wbase) < LZ4_STAGE ? (uint)win[(i) - wbase] : (uint)in[i])
#else
#define IN_BYTE(i) ((uint)in[i])
#endif

// more_length through IN_BYTE
static inline __attribute__((always_inline))
int more_length_t(const __global uchar* in, __local const uchar* win, const long wbase, long* ip,
                 const long limit, const int check_first, long* length)
{
    if (check_first && *ip >= limit) return 1;
    uint b;
    do {
        b = IN_BYTE(*ip);
        (*ip)++;
        *length += b;
        if (*ip > limit) return 1;
    } while (b == 255);
    return 0;
}

// Sequence t's match, which reads this batch's own output up to src_end, into phase 2's list, in order, in
// groups that read nothing written since their barrier (`dirty`: the first byte phase 2 wrote since it); a
// long match is a group of its own.  m: the match's output position.
static inline __attribute__((always_inline))
void group_match(__local uint* tab, const uint t, const uint m, const uint src_end, const uint len,
                 uint* dirty, int* open_short, uint* ndep, uint* ngroups)
{
    const int fence = src_end > *dirty;
    const int longer = len > LZ4_LONG;
    if (fence || longer || !*open_short) {
        tab[T_GFIRST + *ngroups] = *ndep;
        tab[T_GFLAGS + *ngroups] = (fence ? G_BARRIER : 0) | (longer ? G_LONG : 0);
        (*ngroups)++;
        if (fence) *dirty = UINT_MAX;
        *open_short = !longer;
    }
    tab[T_DEP + (*ndep)++] = t;
    *dirty = min(*dirty, m);
}

// Sequence t's match (its checks passed, so it lies in the row's output) into the slot's lists: copied
// in phase 1 when it reads only output from before the batch (`start`), else in phase 2 (group_match).
// m: the match's output position; it reads out[m - off, m - off + min(len, off)) (see the lockstep kernel).
static inline __attribute__((always_inline))
void place_match(__local uint* tab, const uint t, const uint m, const uint off, const uint len, const uint start,
                 uint* dirty, int* open_short, uint* nlong, uint* ndep, uint* ngroups)
{
    const uint src_end = m - off + min(len, off);
    if (src_end <= start) {
        if (len > LZ4_LONG) tab[T_LONG + (*nlong)++] = 2 * t + 1;
        else tab[T_SHORT + t] = 1;
    } else {
        group_match(tab, t, m, src_end, len, dirty, open_short, ndep, ngroups);
    }
}

// (always_inline: PoCL 3.0 passed a wrong address for a local array to the parser when it was a
// function of its own.)
// Lane parses sequences into `tab` (a slot) from its state (ip, op, err, last), with the same rules,
// in the same order, as the lockstep kernel: the first rule a stream breaks gives the same code.
// The sequences before an error stay in the table (each one checked: its copies stay in the row).
static inline __attribute__((always_inline))
void parse_batch(const __global uchar* in, __local const uchar* win, const long wbase,
                const long n_in, const long n_out,
                long* ip_, long* op_, int* err_, int* last_, __local uint* tab, __local uint* counts)
{
    long ip = *ip_, op = *op_;
    int err = *err_, last = *last_;
    uint nt = 0, nlong = 0, ndep = 0, ngroups = 0;
    const long start = op;          // output before this is written when the batch's copies begin
    uint dirty = UINT_MAX;          // first output byte phase 2 wrote since its last barrier
    int open_short = 0;             // the last group takes more short matches
    while (err == LZ4_OK && !last && nt < LZ4_BATCH) {
        const uint token = IN_BYTE(ip);
        ip++;
        long lit = token >> 4;
        if (lit == 15 && more_length_t(in, win, wbase, &ip, n_in - 15, 1, &lit)) {
            err = LZ4_E_LITLEN;
            break;
        }
        const long lit_end = op + lit;
        if (lit_end > n_out - 12 || ip + lit > n_in - 8) {
            if (ip + lit != n_in || lit_end > n_out) {
                err = LZ4_E_LITERALS;
                break;
            }
            last = 1;
        }
        tab[T_LSRC + nt] = (uint)ip;
        tab[T_LLEN + nt] = (uint)lit;
        tab[T_OP + nt] = (uint)op;
        tab[T_MLEN + nt] = 0;
        tab[T_OFF + nt] = 1;
        tab[T_SHORT + nt] = 0;
        if (lit > LZ4_LONG) tab[T_LONG + nlong++] = 2 * nt;
        ip += lit;
        op = lit_end;
        if (!last) {
            const long off = (long)IN_BYTE(ip) | ((long)IN_BYTE(ip + 1) << 8);     // ip + 2 <= n_in - 6
            ip += 2;
            long len = token & 15;
            if (len == 15 && more_length_t(in, win, wbase, &ip, n_in - 4, 0, &len)) err = LZ4_E_MATCHLEN;
            len += 4;
            if (!err && off == 0) err = LZ4_E_OFFSET_ZERO;
            if (!err && off > op) err = LZ4_E_BEFORE;
            if (!err && op + len > n_out - 5) err = LZ4_E_MATCH_END;
            if (err) {
                nt++;           // its literals are checked and copied; the match is not
                break;
            }
            tab[T_OFF + nt] = (uint)off;
            tab[T_MLEN + nt] = (uint)len;
            place_match(tab, nt, (uint)op, (uint)off, (uint)len, (uint)start, &dirty, &open_short, &nlong, &ndep,
                        &ngroups);
            op += len;
        }
        nt++;
    }
    counts[0] = nt;
    counts[1] = nlong;
    counts[2] = ndep;
    counts[3] = ngroups;
    counts[4] = (uint)ip;          // where the next batch starts: the window staged for it
    *ip_ = ip;
    *op_ = op;
    *err_ = err;
    *last_ = last;
}

#if LZ4_PARSE == 2
// A sequence's input-side facts (parse_wide): F_LITLEN, its literal length's extra bytes run past the input
// (nothing else is known); F_INLAST, its literals end less than 8 bytes before the input's end (it can only be
// the last sequence), F_EXACT, they end it exactly; F_MATCHLEN, its match length's extra bytes run into the
// last 4 input bytes.  Any flag but F_EXACT ends the walk.
#define F_LITLEN 1u
#define F_INLAST 2u
#define F_EXACT 4u
#define F_MATCHLEN 8u

// The sequence whose token is at p (p < n_in): its literals (lsrc, lit), match (off, len) and where the next
// token is, as parse_batch reads them, with parse_batch's bounds on every read.
static inline __attribute__((always_inline))
uint seq_at(const __global uchar* in, const long p, const long n_in, long* lsrc, long* lit, uint* off, long* len,
            long* next)
{
    const uint token = in[p];
    long q = p + 1, l = token >> 4;
    if (l == 15 && more_length(in, &q, n_in - 15, 1, &l)) return F_LITLEN;
    *lsrc = q;
    *lit = l;
    q += l;
    uint flags = q == n_in ? F_EXACT : 0;
    *off = 1;
    *len = 0;
    *next = q;
    if (q > n_in - 8) return flags | F_INLAST;
    *off = (uint)in[q] | ((uint)in[q + 1] << 8);                  // q + 2 <= n_in - 6
    q += 2;
    long m = token & 15;
    if (m == 15 && more_length(in, &q, n_in - 4, 0, &m)) flags |= F_MATCHLEN;
    *len = m + 4;
    *next = q;
    return flags;
}

// LZ4_PARSE 2's local words.
#define W_FLAGS (2 * LZ4_BATCH)        // wk: two slots of walked positions [0, 2B), flags [2B, 3B), then:
#define W_N (3 * LZ4_BATCH)            // the positions walked into each slot (2 words)
#define W_STOP (W_N + 2)               // (index << 8) | code of the first sequence that ends the batch
#define W_NLONG (W_N + 3)              // entries in the slot's long-copy list
#define W_OP (W_N + 4)                 // the output position the batch starts at (lane 0's op)
#define W_WORDS (W_N + 5)
#define S_SRC (2 * LZ4_BATCH)          // sc: the scan's two buffers [0, 2B), then each match's source end
#define S_WORDS (3 * LZ4_BATCH)
#define STOP_LAST 0x40                 // (codes below it: LZ4_E_*; 0x80: the sequence is in the table)
#define STOP_IN 0x80

// Lane 0's walk: up to LZ4_BATCH token positions from *wp_ into pos (the token after them left in *wp_);
// *wdone_ once it has walked a sequence that can only end the stream or breaks a rule.  Returns the count.
// It reads nothing but tokens and length bytes, so it runs a batch ahead of the rest (LZ4_PARSE 2).
static inline __attribute__((always_inline))
uint walk_tokens(const __global uchar* in, const long n_in_, const int stop, uint* wp_, int* wdone_,
                 __local uint* pos)
{
    if (stop || *wdone_) return 0;
    uint nw = 0, p = *wp_;
    const uint n_in = (uint)n_in_;
    uint t = in[p];
    // The common token: no extra length bytes, its literals end 8 or more bytes before the input's end,
    // so the next token is 2 bytes (the offset) past them.  That byte is loaded before the test (q <= p +
    // 18: inside the buffer's PAD_READ bytes past the row), so its wait overlaps the test's; any other
    // token goes through seq_at.  Two tokens a turn: the loop's own instructions once for both.
#define WALK_STEP                                                                     \
    {                                                                                 \
        const uint q = p + 3 + (t >> 4);                                              \
        const uint tq = in[q];                                                        \
        pos[nw++] = p;                                                                \
        if (t < 0xF0 && (t & 15) != 15 && q + 6 <= n_in) {                            \
            p = q;                                                                    \
            t = tq;                                                                   \
        } else {                                                                      \
            long lsrc, lit, len, next;                                                \
            uint off;                                                                 \
            const uint f = seq_at(in, p, n_in_, &lsrc, &lit, &off, &len, &next);      \
            if (f & ~F_EXACT) {                                                       \
                *wdone_ = 1;                                                          \
                break;                                                                \
            }                                                                         \
            p = (uint)next;                                                           \
            t = in[p];                          /* p <= n_in - 4 */                   \
        }                                                                             \
        if (nw == LZ4_BATCH) break;                                                   \
    }
    for (;;) {
        WALK_STEP
        WALK_STEP
    }
#undef WALK_STEP
    *wp_ = p;
    return nw;
}

// parse_batch's work, its table and its errors, with every lane (LZ4_PARSE 2), for the nw sequences walked
// into pos: every lane reads its sequences into the slot (their input-side facts, F_*); a scan of their
// lengths gives their output positions; every lane applies the output-side rules to its sequences, and the
// first that breaks a rule or ends the stream (an atomic minimum) ends the batch where parse_batch would;
// every lane places its matches that read output from before the batch and marks the others (their source's
// end) for group_matches, which LZ4_GROUP_LANE runs in the batch's phase 1.  Lengths in the slot are capped at n_out + 1 and the scan's sums saturate
// there: a longer literal or match breaks a rule anyway (so each answer is kept), and the sums stay in 32
// bits (n_out <= blosc.MAX_BLOCKSIZE < 2^30).  Called by every lane at the same point (it holds barriers);
// only lane 0's state (op, err, last) is the stream's.
static inline __attribute__((always_inline))
void parse_wide(const __global uchar* in, const long n_in_, const long n_out_, const long lane,
                long* op_, int* err_, int* last_, __local uint* tab, __local uint* counts,
                __local const uint* pos, const uint nw, __local uint* wk, __local uint* sc)
{
    if (lane == 0) {
        wk[W_STOP] = UINT_MAX;
        wk[W_NLONG] = 0;
        wk[W_OP] = (uint)*op_;
    }
    const uint cap = (uint)n_out_ + 1, n_out = (uint)n_out_;
    for (uint k = (uint)lane; k < nw; k += LZ4_WG) {
        long lsrc = 0, lit = 0, len = 0, next = 0;
        uint off = 1;
        const uint f = seq_at(in, pos[k], n_in_, &lsrc, &lit, &off, &len, &next);
        __local uint* row = tab + k;
        const uint l = (uint)min(lit, (long)cap), m = (uint)min(len, (long)cap);
        row[T_LSRC] = (uint)lsrc;
        row[T_LLEN] = l;
        row[T_OFF] = off;
        row[T_MLEN] = m;
        row[T_SHORT] = 0;
        wk[W_FLAGS + k] = f;
        sc[k] = min(l + m, cap);
    }
    // inclusive scan of the sequences' output lengths (saturating at cap), between sc's two buffers
    uint from = 0;
    for (uint d = 1; d < nw; d <<= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint k = (uint)lane; k < nw; k += LZ4_WG) {
            const uint v = sc[from + k];
            sc[(from ^ LZ4_BATCH) + k] = k >= d ? min(v + sc[from + k - d], cap) : v;
        }
        from ^= LZ4_BATCH;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // the rules that need the output position, each sequence on its own; the first to stop wins
    const uint op0 = wk[W_OP];
    for (uint k = (uint)lane; k < nw; k += LZ4_WG) {
        __local uint* row = tab + k;
        const uint f = wk[W_FLAGS + k], lit = row[T_LLEN], len = row[T_MLEN], off = row[T_OFF];
        const uint op = min(op0 + (k ? sc[from + k - 1] : 0), cap);
        const uint lit_end = op + lit;
        row[T_OP] = op;
        uint code = 0;
        if (!(f == 0 && lit_end + 12 <= n_out && off - 1 < lit_end && lit_end + len + 5 <= n_out)) {
            if (f & F_LITLEN) code = LZ4_E_LITLEN;
            else if (lit_end + 12 > n_out || (f & F_INLAST))
                code = (!(f & F_EXACT) || lit_end > n_out) ? LZ4_E_LITERALS : STOP_IN | STOP_LAST;
            else if (f & F_MATCHLEN) code = STOP_IN | LZ4_E_MATCHLEN;
            else if (off == 0) code = STOP_IN | LZ4_E_OFFSET_ZERO;
            else if (off > lit_end) code = STOP_IN | LZ4_E_BEFORE;
            else code = STOP_IN | LZ4_E_MATCH_END;
            atomic_min((volatile __local uint*)&wk[W_STOP], (k << 8) | code);
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const uint stop = wk[W_STOP];
    const uint kstop = stop >> 8, code = stop & 0xFF;
    const uint nt = stop == UINT_MAX ? nw : kstop + ((code & STOP_IN) ? 1 : 0);
    const uint start = op0;
    // literals and matches phase 1 copies (the order of the long list does not matter); the matches that
    // read this batch's output are marked for lane 0 by their source's end (0: none)
    for (uint k = (uint)lane; k < nt; k += LZ4_WG) {
        __local uint* row = tab + k;
        const uint lit = row[T_LLEN], len = row[T_MLEN], off = row[T_OFF], lit_end = row[T_OP] + lit;
        if (lit > LZ4_LONG) tab[T_LONG + atomic_inc((volatile __local uint*)&wk[W_NLONG])] = 2 * k;
        uint src_end = 0;
        if (k == kstop) {
            row[T_MLEN] = 0;            // the last sequence, or one whose match is refused: no match
            row[T_OFF] = 1;
        } else {
            src_end = lit_end - off + min(len, off);
            if (src_end <= start) {
                if (len > LZ4_LONG) tab[T_LONG + atomic_inc((volatile __local uint*)&wk[W_NLONG])] = 2 * k + 1;
                else row[T_SHORT] = 1;
                src_end = 0;
            }
        }
        sc[S_SRC + k] = src_end;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lane != 0) return;
    uint op = op0;
    int err = *err_, last = *last_;
    if (stop == UINT_MAX) {
        if (nw) op = min(op0 + sc[from + nw - 1], cap);
    } else {
        const __local uint* row = tab + kstop;
        op = (code & STOP_IN) ? row[T_OP] + row[T_LLEN] : row[T_OP];
        if ((code & ~STOP_IN) == STOP_LAST) last = 1;
        else err = (int)(code & ~STOP_IN);
    }
    counts[0] = nt;
    counts[1] = wk[W_NLONG];
    counts[4] = 0;                  // (no staged window; counts[2] and [3]: group_matches)
    *op_ = op;
    *err_ = err;
    *last_ = last;
}

// Phase 2's ordered groups of a batch built by parse_wide (its matches that read the batch's own output,
// marked by their source's end in src_end, 0 for none), as parse_batch makes them (group_match): by one lane, in phase 1
// of the batch's own turn (LZ4_GROUP_LANE), beside the walk of the next batch and the copies.
static inline __attribute__((always_inline))
void group_matches(__local uint* tab, __local uint* counts, __local const uint* src_end, const uint nt)
{
    uint ndep = 0, ngroups = 0;
    uint dirty = UINT_MAX;
    int open_short = 0;
    for (uint k = 0; k < nt; k++) {
        const uint e = src_end[k];
        if (e == 0) continue;
        const __local uint* row = tab + k;
        group_match(tab, k, row[T_OP] + row[T_LLEN], e, row[T_MLEN], &dirty, &open_short, &ndep, &ngroups);
    }
    counts[2] = ndep;
    counts[3] = ngroups;
}
#else
#define PARSE parse_batch
#endif

// Same arguments, rows and errors as the lockstep kernel.  Every lane runs the
// same iterations of the loops around barriers (their bounds come from local
// memory after a barrier); only lane 0's parsing state is the stream's.
// Bounds: a sequence enters the table only once the lockstep kernel's checks
// passed for it, so its literals lie in the row's input and its literal and
// match copies in the row's output (a match's source from offset <= its start);
// the window is loaded only from below n_in; the parser ends after at most one
// sequence per input byte.
__kernel __attribute__((reqd_work_group_size(LZ4_WG, 1, 1)))
void lz4_streams(const __global uchar* restrict src,
                 __global uchar* restrict dst,
                 const __global ulong* restrict table,
                 __global int* restrict errors)
{
    __local uint tabs[2 * T_WORDS];
    __local uint counts[2 * C_WORDS];
#if LZ4_PARSE == 2
    __local uint wk[W_WORDS];             // parse_wide's walk, flags and batch words
    __local uint sc[S_WORDS];             // its scan and the matches' source ends
#endif
#if LZ4_STAGE > 0
    __local uchar win[LZ4_STAGE];
#else
    __local uchar win[1];
#endif
    long wbase = 0;
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
#if LZ4_STAGE > 0
    STAGE(0)
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
#if LZ4_PARSE == 2
    uint wpos = 0;                  // lane 0's walk: the next token to walk, and whether it is done
    int wdone = 0;
    if (lane == 0) wk[W_N] = walk_tokens(in, n_in, err != LZ4_OK || last, &wpos, &wdone, wk);
    barrier(CLK_LOCAL_MEM_FENCE);
    parse_wide(in, n_in, n_out, lane, &op, &err, &last, tabs, counts, wk, wk[W_N], wk, sc);
#else
    if (lane == 0) PARSE(in, win, wbase, n_in, n_out, &ip, &op, &err, &last, tabs, counts);
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
#if LZ4_STAGE > 0
    STAGE(counts[4])
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
    uint cur = 0;
    uint nt = counts[0];
    while (nt > 0) {
        __local uint* tab = tabs + cur * T_WORDS;
        __local const uint* cnt = counts + C_WORDS * cur;
        const uint nlong = cnt[1];
        // phase 1: lane 0 parses the next batch (LZ4_PARSE 2: walks its tokens); the copying lanes copy
        // the literals and the matches that read only output from before this batch
#if LZ4_PARSE == 2
        // (LZ4_PARSE 2: lane 0 walks the next batch's tokens here; the batch is built after the copies)
        if (lane == 0) wk[W_N + (cur ^ 1)] = walk_tokens(in, n_in, err != LZ4_OK || last, &wpos, &wdone,
                                                         wk + (cur ^ 1) * LZ4_BATCH);
        if (lane == LZ4_GROUP_LANE) group_matches(tab, counts + C_WORDS * cur, sc + S_SRC, nt);
#else
        if (lane == 0) PARSE(in, win, wbase, n_in, n_out, &ip, &op, &err, &last,
                                   tabs + (cur ^ 1) * T_WORDS, counts + C_WORDS * (cur ^ 1));
#endif
        if (lane >= LZ4_COPY_FROM) {
            const uint c = (uint)lane - LZ4_COPY_FROM;
            for (uint t = c; t < nt; t += N_COPY) {
                const uint o = tab[T_OP + t], lit = tab[T_LLEN + t];
                if (lit <= LZ4_LONG) copy_short(out + o, in + tab[T_LSRC + t], lit, lit);
                if (tab[T_SHORT + t]) {
                    const uint m = o + lit, off = tab[T_OFF + t];
                    copy_short(out + m, out + m - off, tab[T_MLEN + t], off);
                }
            }
            for (uint k = 0; k < nlong; k++) {
                const uint e = tab[T_LONG + k], t = e >> 1;
                const uint o = tab[T_OP + t], lit = tab[T_LLEN + t];
                if (e & 1) {
                    const uint m = o + lit, off = tab[T_OFF + t], len = tab[T_MLEN + t];
                    for (uint i = c; i < len; i += N_COPY) out[m + i] = out[m - off + (off >= len ? i : i % off)];
                } else {
                    const __global uchar* l = in + tab[T_LSRC + t];
                    for (uint i = c; i < lit; i += N_COPY) out[o + i] = l[i];
                }
            }
        }
        barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
        const uint ndep = cnt[2], ngroups = cnt[3];
#if LZ4_PARSE == 2
        parse_wide(in, n_in, n_out, lane, &op, &err, &last, tabs + (cur ^ 1) * T_WORDS,
                   counts + C_WORDS * (cur ^ 1), wk + (cur ^ 1) * LZ4_BATCH, wk[W_N + (cur ^ 1)], wk, sc);
#endif
        // the parser is done with the window: stage the one the batch after the next starts in
        STAGE(counts[C_WORDS * (cur ^ 1) + 4])
        // phase 2: the matches that read this batch's output, group by group, in order
        for (uint g = 0; g < ngroups; g++) {
            const uint flags = tab[T_GFLAGS + g];
            const uint first = tab[T_GFIRST + g];
            const uint end = g + 1 < ngroups ? tab[T_GFIRST + g + 1] : ndep;
#if LZ4_WG > 1
            if (flags & G_BARRIER) barrier(CLK_GLOBAL_MEM_FENCE);
#endif
            if (flags & G_LONG) {
                const uint t = tab[T_DEP + first];
                const uint m = tab[T_OP + t] + tab[T_LLEN + t], off = tab[T_OFF + t], len = tab[T_MLEN + t];
                for (uint i = (uint)lane; i < len; i += LZ4_WG) out[m + i] = out[m - off + (off >= len ? i : i % off)];
            } else {
                for (uint k = first + (uint)lane; k < end; k += LZ4_WG) {
                    const uint t = tab[T_DEP + k];
                    const uint m = tab[T_OP + t] + tab[T_LLEN + t], off = tab[T_OFF + t];
                    copy_short(out + m, out + m - off, tab[T_MLEN + t], off);
                }
            }
        }
        barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
        cur ^= 1;
        nt = counts[C_WORDS * cur];
    }
    if (err == LZ4_OK && op != n_out) err = LZ4_E_SIZE;
    if (lane == 0) errors[s] = err;
}
#endif  // LZ4_MODE == 1

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
#if LZ4_UNSHUFFLE == 2
    // four elements a work-item: a word from each plane (each plane read coalesced, a word a lane), the
    // bytes put in order in registers, and 16 bytes stored a time
    if (mode == 1 && (ts == 4 || ts == 8) && (n & 3) == 0 && ((size_t)in & 3) == 0 && ((size_t)(dst + off) & 15) == 0) {
        const __global uint* w = (const __global uint*)in;
        __global uint4* o = (__global uint4*)(dst + off);
        const uint nw = n / 4;          // words a plane
        for (uint g = get_global_id(0); g < nw; g += get_global_size(0)) {
            if (ts == 4) {
                const uchar4 a = as_uchar4(w[g]), c = as_uchar4(w[nw + g]);
                const uchar4 d = as_uchar4(w[2 * nw + g]), e = as_uchar4(w[3 * nw + g]);
                o[g] = (uint4)(as_uint((uchar4)(a.s0, c.s0, d.s0, e.s0)), as_uint((uchar4)(a.s1, c.s1, d.s1, e.s1)),
                               as_uint((uchar4)(a.s2, c.s2, d.s2, e.s2)), as_uint((uchar4)(a.s3, c.s3, d.s3, e.s3)));
            } else {
                uchar4 q[8];
#pragma unroll
                for (uint j = 0; j < 8; j++) q[j] = as_uchar4(w[j * nw + g]);
                o[2 * g] = (uint4)(as_uint((uchar4)(q[0].s0, q[1].s0, q[2].s0, q[3].s0)),
                                   as_uint((uchar4)(q[4].s0, q[5].s0, q[6].s0, q[7].s0)),
                                   as_uint((uchar4)(q[0].s1, q[1].s1, q[2].s1, q[3].s1)),
                                   as_uint((uchar4)(q[4].s1, q[5].s1, q[6].s1, q[7].s1)));
                o[2 * g + 1] = (uint4)(as_uint((uchar4)(q[0].s2, q[1].s2, q[2].s2, q[3].s2)),
                                       as_uint((uchar4)(q[4].s2, q[5].s2, q[6].s2, q[7].s2)),
                                       as_uint((uchar4)(q[0].s3, q[1].s3, q[2].s3, q[3].s3)),
                                       as_uint((uchar4)(q[4].s3, q[5].s3, q[6].s3, q[7].s3)));
            }
        }
        for (uint p = n * ts + get_global_id(0); p < size; p += get_global_size(0)) dst[off + p] = in[p];
        return;
    }
#endif
#if LZ4_UNSHUFFLE >= 1
    if (mode == 1) {
        __global uchar* out = dst + off;
        const int words = (ts == 4 || ts == 8) && ((size_t)out & (ts - 1)) == 0;
        for (uint e = get_global_id(0); e < n; e += get_global_size(0)) {
            if (words && ts == 4) {
                ((__global uint*)out)[e] = as_uint((uchar4)(in[e], in[n + e], in[2 * n + e], in[3 * n + e]));
            } else if (words) {
                ((__global uint2*)out)[e] = as_uint2((uchar8)(in[e], in[n + e], in[2 * n + e], in[3 * n + e],
                                                              in[4 * n + e], in[5 * n + e], in[6 * n + e],
                                                              in[7 * n + e]));
            } else {
                for (uint j = 0; j < ts; j++) out[e * ts + j] = in[j * n + e];
            }
        }
        for (uint p = n * ts + get_global_id(0); p < size; p += get_global_size(0)) out[p] = in[p];
        return;
    }
#endif
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
