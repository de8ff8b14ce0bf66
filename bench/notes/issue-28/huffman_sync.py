"""How soon a Huffman decode started at any bit falls onto the true symbol starts, on Zarr's zstd chunks (issue 28).

    python bench/notes/issue-28/huffman_sync.py OUT.json [--levels 3,1,19] [--data normal,product] [--starts 40]

zstd_decode.cl's reader 6 splits each Huffman stream among work-items, each starting from a bit of its own,
and relies on a prefix code's resynchronization: a read started inside a code soon lands on a symbol start
of the true read, and from there is the same read.  Here, on the host (no device), for float32 chunks of
4 MiB compressed as numcodecs does, every 9th literal stream of the frame is read from its start (the true
symbol starts), then from ``--starts`` random bits, counting the symbols each read takes before it lands on a
true start.  Prints and records the mean and the 50th, 90th, 99th percentiles and the largest, per level
and data.  The work-items' parts (4 Ki symbols at 16 a stream of a 128 KiB block) are far longer.
"""
import argparse
import json
import os


def sync_counts(frame: bytes, starts: int, rng) -> list:
    """For some streams of ``frame``, the symbols a read from each of ``starts`` random bits takes to land
    on one of the true read's symbol starts."""
    import numpy as np

    from dgemm.opencl.codecs import zstd_entropy as ent
    from dgemm.opencl.codecs import zstd_fastplan
    from dgemm.opencl.codecs import zstd_frames as zf

    plan = zstd_fastplan.plan(frame)
    buf = np.frombuffer(frame, np.uint8)
    out = []
    for s in plan.streams[::9]:
        t = plan.trees[s[zf.S_TABLE]]
        table, log, _ = ent.huffman_tree(frame, int(t[zf.T_SRC]), int(t[zf.T_SRC] + t[zf.T_LEN]))
        s0, n = int(s[zf.S_SRC]), int(s[zf.S_LEN])
        bits = np.unpackbits(buf[s0:s0 + n], bitorder="little")
        top = 8 * (n - 1) + int(buf[s0 + n - 1]).bit_length() - 1
        padded = np.concatenate([np.zeros(log, np.uint8), bits])     # bits below the start read as 0
        weights = 1 << np.arange(log - 1, -1, -1)
        # each position's code length: the table entry of the log bits below it, most significant first
        lengths = np.zeros(top + 1, np.int64)
        for q in range(1, top + 1):
            lengths[q] = table[int(padded[q - 1 + log - np.arange(log)] @ weights)] >> 8
        true = np.zeros(top + 1, bool)
        q = top
        while q > 0:
            true[q] = True
            q -= lengths[q]
        for start in rng.integers(log + 1, top, starts):
            q, k = int(start), 0
            while q > 0 and not true[q]:
                q -= lengths[q]
                k += 1
            out.append(k)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="the JSON record to write")
    p.add_argument("--levels", default="3,1,19", help="zstd levels (default 3,1,19)")
    p.add_argument("--data", default="normal,product", help="float32 data kinds: normal, product (default both)")
    p.add_argument("--starts", type=int, default=40, help="random starting bits a stream (default 40)")
    args = p.parse_args()

    import numpy as np
    from numcodecs import Zstd

    from dgemm.benchmarks.records import write_json
    from dgemm.provenance import command_line, git_commit, utc_now

    rng = np.random.default_rng(1)
    rows = []
    for kind in args.data.split(","):
        if kind == "normal":
            a = rng.standard_normal(1 << 20).astype(np.float32)
        else:           # a product's floats: sums of products
            a = (rng.standard_normal((1 << 14, 16)) @ rng.standard_normal((16, 64))).astype(np.float32)
        for level in (int(x) for x in args.levels.split(",")):
            d = np.array(sync_counts(Zstd(level=level).encode(a), args.starts, rng))
            row = {"data": kind, "level": level, "reads": int(d.size), "mean": round(float(d.mean()), 2),
                   "p50": float(np.percentile(d, 50)), "p90": float(np.percentile(d, 90)),
                   "p99": float(np.percentile(d, 99)), "max": int(d.max())}
            rows.append(row)
            print(json.dumps(row), flush=True)
    record = {"meta": {"what": "symbols a Huffman read started at a random bit takes to land on the true symbol "
                               "starts (zstd literal streams of 4 MiB float32 chunks, numcodecs' Zstd)",
                       "device": "host (no device)", "cores": os.cpu_count(), "date": utc_now(),
                       "commit": git_commit()[0], "command": command_line()},
              "rows": rows}
    write_json(args.out, record)


if __name__ == "__main__":
    main()
