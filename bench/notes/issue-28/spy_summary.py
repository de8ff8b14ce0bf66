"""py-spy raw profiles of a worker (``-f raw``), summed for a record (issue 28).

    python bench/notes/issue-28/spy_summary.py OUT.json --what "..." NAME=PROFILE[.gz] ...

Each profile is summed two ways, the worker process's samples alone (the
spawned one):

- ``readers``: the reader threads' samples inside a block's read
  (``BlockEngine._fetch``), by what the thread was doing: decoding on the
  host (libzstd's frames), waiting to take Python's lock back
  (``pthread_cond_timedwait`` right under a foreign call: what CPython's
  ``take_gil`` waits in), waiting on a lock or semaphore of dgemm's
  (``PyThread_acquire_lock_timed``), reading a file, copying; each with the
  innermost Python frame's module.  Meaningful for ``--idle --native``
  profiles (every thread, waiting or not, native frames named).
- ``threads`` and ``frames``: samples by thread group and by innermost
  dgemm frame; for ``--gil`` profiles these are the lock's holders.
"""
import argparse
import collections
import gzip
import json
import os
import re
import sys
import time


def _stacks(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if stack and n.isdigit():
                yield stack.split(";"), int(n)


def _group(frames) -> str:
    named = [f for f in frames if f.startswith("thread (")]
    name = named[0].split(": ", 1)[-1] if named else "?"
    return re.sub(r"[-_]\d+(-\d+)*$", "", name)


def _module(frame: str) -> str:
    return frame.rsplit("/", 1)[-1].split(":")[0] if ".py:" in frame else "?"


def _reader_state(frames) -> str:
    py = [f for f in frames if ".py:" in f]
    where = _module(py[-1]) if py else "?"
    tail = frames[-2:]
    if any("pthread_cond_timedwait" in f for f in tail) and not any("PyThread_acquire_lock" in f for f in frames):
        return f"waiting for Python's lock, after {where}"
    if any("libzstd" in f for f in frames):
        return "host zstd decode"
    if any("PyThread_acquire_lock_timed" in f for f in frames):
        mine = [f for f in frames if "dgemm/" in f]
        return f"waiting on a lock or semaphore, in {mine[-1].rsplit('/', 1)[-1].rstrip(')') if mine else where}"
    if "preadv" in frames[-1] or "pread" in frames[-1]:
        return "reading a file"
    if any("_contig_to_contig" in f or "memcpy" in f or "memmove" in f for f in frames[-3:]):
        return f"copying, in {where}"
    return f"other, in {where}"


def summary(path: str) -> dict:
    readers, threads, frames = collections.Counter(), collections.Counter(), collections.Counter()
    total = 0
    for stack, n in _stacks(path):
        if not any("spawn_main" in f for f in stack[:3]):    # the worker process alone
            continue
        total += n
        group = _group(stack)
        threads[group] += n
        mine = [f for f in stack if "dgemm/" in f]
        frames[f"{group} | {mine[-1].split(' (')[0] if mine else '-'}"] += n
        if group == "dgemm-read" and any("BlockEngine._fetch" in f for f in stack):
            readers[_reader_state(stack)] += n
    inside = sum(readers.values())
    return {"samples": total, "reader_samples_in_fetch": inside,
            "readers": {k: [v, round(100 * v / max(inside, 1), 1)] for k, v in readers.most_common(25)},
            "threads": dict(threads.most_common(12)), "frames": dict(frames.most_common(30))}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("profiles", nargs="+", help="NAME=PATH, a py-spy raw profile (gzipped or not)")
    p.add_argument("--what", default="", help="what the profiles are, for the record's meta")
    p.add_argument("--meta", default="{}", help="more of the record's meta, as JSON (device, cores, commit...)")
    args = p.parse_args()
    record = {"meta": {"what": args.what or __doc__.splitlines()[0], "summarised": time.strftime("%Y-%m-%d"),
                       "command": " ".join([os.path.basename(sys.executable)] + sys.argv), **json.loads(args.meta)},
              "profiles": {}}
    for spec in args.profiles:
        name, _, path = spec.partition("=")
        record["profiles"][name] = summary(path)
        print(name, json.dumps(record["profiles"][name]["readers"])[:600])
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
