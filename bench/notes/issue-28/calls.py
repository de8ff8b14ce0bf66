"""Where a shared decode call's time goes, from a ``timeline.py`` record (issue 28, twenty-ninth session on).

    python bench/notes/issue-28/calls.py TIMELINE.json [--until SECONDS] [--after SECONDS]

A worker on two H200s reads its blocks at about 70 a second whether it has 12, 16 or 20 readers, and 8 decode slots
are slower than 4: each call's latency, over the 4 slots, may bound the rate.  For each run and worker, over the
calls that start before ``--until`` (all by default): the calls, blocks a call, and the means of the leader's host
time (``batch_call``; the record's totals split it further), of the call's device span (its first command queued to
its last command's end), of the uploads' and the kernels' durations, and of the time from the leader's return to
the call's last kernel's end (what the slot's next call waits for); and the leader's steps before the kernels'
launch (:func:`_phases`: the plan kernel's wait and run, what follows it, the tables; thirtieth session).  A call's
commands are taken to be those its leader's thread enqueued from the call's start to its return (``timeline.py``
records each command's thread since 2758f5a; older records have none, and the script says so).  ``--after``: the
calls that start after it.
"""
import argparse
import json
import statistics


def calls_of(log: list, until: float | None = None, after: float | None = None) -> list[dict]:
    """Each ``batch_call`` of ``log`` (a ``timeline.py`` run's log) with its commands' times."""
    cmds = [x for x in log if x[0] == "cmd" and len(x) > 7 and x[2] == "decode"]
    by_thread: dict = {}
    for x in cmds:
        by_thread.setdefault(x[7], []).append(x)
    out = []
    for b in sorted((x for x in log if x[0] == "batch_call"), key=lambda x: x[2]):
        _, thread, start, end = b[:4]
        if (until is not None and start > until) or (after is not None and start < after):
            continue
        mine = [x for x in by_thread.get(thread, ()) if start <= x[4] <= end]
        if not mine:
            continue
        kernels = [x for x in mine if x[3] == "kernel"]
        call = {"start": start, "host": end - start,
                "device_span": max(x[6] for x in mine) - min(x[4] for x in mine),
                "uploads": sum(x[6] - x[5] for x in mine if x[3] == "upload"),
                "kernels": sum(x[6] - x[5] for x in kernels),
                "after_return": max((x[6] for x in kernels), default=end) - end}
        call.update(_phases(log, thread, start, end, kernels, [x for x in mine if x[3] == "download"]))
        out.append(call)
    return out


def _phases(log: list, thread, start: float, end: float, kernels: list, reads: list = ()) -> dict:
    """The leader's steps before its kernels' launch: until its device plan, the plan kernel's wait in its queue and
    its run (the call's first kernel, since 519a164 among the call's commands), from its end to the plan's end (the
    event's wait, the rows' read-back, the frames' plans), the call's tables, and from the execution's launch to the
    return.  Where the call's commands include its rows' read (``reads``: its downloads; since the thirty-third
    session's ddc3243), from the kernel's end to the read's start, its run, and from its end to the plan's end (the
    read's end seen, the frames' plans).  Empty where the record has no device plan or launch for the call."""
    def step(name):
        return next((x for x in log if x[0] == name and x[1] == thread and start <= x[2] <= end), None)
    plan, tables, launch = step("devplan"), step("call_tables"), step("execute_launch")
    if plan is None or launch is None:
        return {}
    out = {"to_plan": plan[2] - start, "plan_step": plan[3] - plan[2], "to_launch": launch[3] - start,
           "launch_to_return": end - launch[3]}
    first = next((k for k in sorted(kernels, key=lambda k: k[4]) if plan[2] <= k[4] <= plan[3]), None)
    if first is not None:
        out.update(plan_queued=first[5] - first[4], plan_kernel=first[6] - first[5],
                   after_plan_kernel=plan[3] - first[6])
        read = next((r for r in sorted(reads, key=lambda r: r[4]) if plan[2] <= r[4] <= plan[3]), None)
        if read is not None:
            out.update(plan_read_wait=read[5] - first[6], plan_read=read[6] - read[5],
                       after_plan_read=plan[3] - read[6])
    if tables is not None:
        out["tables"] = tables[3] - tables[2]
    return out


def summary(calls: list[dict], blocks: int) -> dict:
    if not calls:
        return {"calls": 0}
    keys = ("host", "device_span", "uploads", "kernels", "after_return", "to_plan", "plan_queued", "plan_kernel",
            "after_plan_kernel", "plan_read_wait", "plan_read", "after_plan_read", "plan_step", "tables", "to_launch",
            "launch_to_return")
    return {"calls": len(calls), "blocks_a_call": round(blocks / len(calls), 2),
            **{f"{k}_ms": round(1e3 * statistics.mean(c[k] for c in calls if k in c), 1) for k in keys
               if any(k in c for c in calls)}}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("timeline")
    p.add_argument("--until", type=float, default=None, help="the calls that start before this (s)")
    p.add_argument("--after", type=float, default=None, help="the calls that start after this (s)")
    args = p.parse_args()
    for r in json.load(open(args.timeline))["runs"]:
        log = r.get("log", [])
        if not any(x[0] == "cmd" and len(x) > 7 for x in log):
            print(r.get("worker"), "this record's commands have no thread (timeline.py before 2758f5a)")
            continue
        calls = calls_of(log, args.until, args.after)
        blocks = sum(1 for x in log if x[0] == "batchable" and (args.until is None or x[2] <= args.until)
                     and (args.after is None or x[2] >= args.after))
        print(r.get("mode"), r.get("worker"), r.get("wall_s"), json.dumps(summary(calls, blocks)))


if __name__ == "__main__":
    main()
