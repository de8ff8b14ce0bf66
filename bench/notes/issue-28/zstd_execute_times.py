"""The zstd decoder's sequence-execution kernels' profiled times for one 16 MiB frame (issue 28).

    python bench/notes/issue-28/zstd_execute_times.py [--device pocl] [--lanes 1,4] [--levels 3,9]

Decodes one numcodecs ``Zstd(level)`` frame of a float32 random walk and one of small int32 values (almost
every match of every block reads the match before it) and prints, per (data, lanes, level), the median of
5 decodes of each execution kernel's event time in ms (``copy``, ``block_scan``, ``frame_scan``,
``blocks``, ``origins``, ``execute``; before the per-block execution there was only ``copy`` and
``execute``) and their sum.  To compare two commits, run it with each one's checkout first on
``PYTHONPATH``.  A timing print, not a benchmark record: on PoCL (a CPU) it says nothing of a GPU.
"""
import argparse
import statistics

STAGE = ("copy", "block_scan", "frame_scan", "blocks", "origins", "execute")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default=None, help="an OpenCL device as DGEMM_DEVICES names one")
    p.add_argument("--lanes", default="1,4")
    p.add_argument("--levels", default="3,9")
    args = p.parse_args()

    import numpy as np
    from numcodecs import Zstd

    import dgemm
    from dgemm.opencl.codecs import zstd_decode as zd
    from dgemm.opencl.device import Device
    from dgemm.opencl.discovery import select_devices

    device = Device(select_devices(args.device)[0])
    rng = np.random.default_rng(1)
    n = 4 << 20
    datas = {"walk": np.cumsum(rng.standard_normal(n, dtype=np.float32), dtype=np.float32),
             "ints": (rng.integers(0, 1000, n) // 7).astype(np.int32)}
    print(dgemm.__file__, device.info.name)
    for lanes in (int(x) for x in args.lanes.split(",")):
        for name, arr in datas.items():
            for level in (int(x) for x in args.levels.split(",")):
                frame = Zstd(level=level).encode(arr)
                out = device.buffer(arr.nbytes, "decoded")
                per = {}
                try:
                    for r in range(6):
                        events = []
                        zd.decode_zstd(device, [frame], out, lanes=lanes, events=events)
                        for what, e in events if r else ():       # the first call builds the program
                            if what in STAGE:
                                per.setdefault(what, [0.0] * 5)[r - 1] += (e.profile.end - e.profile.start) * 1e-6
                finally:
                    out.release()
                ms = {what: round(statistics.median(v), 2) for what, v in per.items()}
                print(f"{name} lanes {lanes} level {level}: total {sum(ms.values()):.2f} ms {ms}", flush=True)


if __name__ == "__main__":
    main()
