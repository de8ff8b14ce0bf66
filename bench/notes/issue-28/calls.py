"""Where a shared decode call's time goes, from a ``timeline.py`` record (issue 28, twenty-ninth session on).

    python bench/notes/issue-28/calls.py TIMELINE.json [--until SECONDS]

A worker on two H200s reads its blocks at about 70 a second whether it has 12, 16 or 20 readers, and 8 decode slots
are slower than 4: each call's latency, over the 4 slots, may bound the rate.  For each run and worker, over the
calls that start before ``--until`` (all by default): the calls, blocks a call, and the means of the leader's host
time (``batch_call``; the record's totals split it further), of the call's device span (its first command queued to
its last command's end), of the uploads' and the kernels' durations, and of the time from the leader's return to
the call's last kernel's end (what the slot's next call waits for).  A call's commands are taken to be those its
leader's thread enqueued from the call's start to its return: to be checked against the first GPU record that has
them (``timeline.py`` records each command's thread since 2758f5a; older records have none, and the script says so).
"""
import argparse
import json
import statistics


def calls_of(log: list, until: float | None = None) -> list[dict]:
    """Each ``batch_call`` of ``log`` (a ``timeline.py`` run's log) with its commands' times."""
    cmds = [x for x in log if x[0] == "cmd" and len(x) > 7 and x[2] == "decode"]
    by_thread: dict = {}
    for x in cmds:
        by_thread.setdefault(x[7], []).append(x)
    out = []
    for b in sorted((x for x in log if x[0] == "batch_call"), key=lambda x: x[2]):
        _, thread, start, end = b[:4]
        if until is not None and start > until:
            continue
        mine = [x for x in by_thread.get(thread, ()) if start <= x[4] <= end]
        if not mine:
            continue
        kernels = [x for x in mine if x[3] == "kernel"]
        out.append({"start": start, "host": end - start,
                    "device_span": max(x[6] for x in mine) - min(x[4] for x in mine),
                    "uploads": sum(x[6] - x[5] for x in mine if x[3] == "upload"),
                    "kernels": sum(x[6] - x[5] for x in kernels),
                    "after_return": max((x[6] for x in kernels), default=end) - end})
    return out


def summary(calls: list[dict], blocks: int) -> dict:
    if not calls:
        return {"calls": 0}
    keys = ("host", "device_span", "uploads", "kernels", "after_return")
    return {"calls": len(calls), "blocks_a_call": round(blocks / len(calls), 2),
            **{f"{k}_ms": round(1e3 * statistics.mean(c[k] for c in calls), 1) for k in keys}}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("timeline")
    p.add_argument("--until", type=float, default=None)
    args = p.parse_args()
    for r in json.load(open(args.timeline))["runs"]:
        log = r.get("log", [])
        if not any(x[0] == "cmd" and len(x) > 7 for x in log):
            print(r.get("worker"), "this record's commands have no thread (timeline.py before 2758f5a)")
            continue
        calls = calls_of(log, args.until)
        blocks = sum(1 for x in log if x[0] == "batchable" and (args.until is None or x[2] <= args.until))
        print(r.get("mode"), r.get("worker"), r.get("wall_s"), json.dumps(summary(calls, blocks)))


if __name__ == "__main__":
    main()
