"""The rows of ``upload_paths_probe.py --start-at`` records, one a process, summed over the processes (issue 28).

    python bench/notes/issue-28/twoprocs.py FOLDER PREFIX

Reads FOLDER/PREFIX-rR-processN.json (round R, process N: ``gpu_session_32e.sh``, ``gpu_session_33a.sh``) and
prints, for each round and row, each process's GB/s uploaded and their sum, C's traffic and the kernels' launches
beside them where the rows have them (``--beside``), and whether every process's first upload read back right.
"""
import argparse
import glob
import json
import os
import re


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder")
    p.add_argument("prefix")
    args = p.parse_args()
    found: dict = {}
    for path in glob.glob(os.path.join(args.folder, f"{args.prefix}-r*-process*.json")):
        m = re.search(r"-r(\d+)-process(\d+)\.json$", path)
        if m:
            found.setdefault(int(m.group(1)), []).append((int(m.group(2)), json.load(open(path))["rows"]))
    for r in sorted(found):
        rows = [rows for _, rows in sorted(found[r])]
        for parts in zip(*rows):
            first = parts[0]
            line = [f"round {r}", first["path"], f"{first['threads']} threads a process",
                    f"beside {first.get('beside', 'none')}:",
                    "+".join(str(x["gb_s"]) for x in parts), "=", f"{round(sum(x['gb_s'] for x in parts), 2)} GB/s up"]
            if "down_gb_s" in first:
                line += [f"down {round(sum(x['down_gb_s'] for x in parts), 2)} GB/s",
                         f"launches/s {round(sum(x['gemm_launches_s'] for x in parts), 1)}"]
            print(*line, "checked", all(x["checked"] for x in parts), flush=True)


if __name__ == "__main__":
    main()
