"""``dgemm bench plot``: the scaling plot from e2e records."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dgemm.benchmarks import plots
from dgemm.cli import cli

pytest.importorskip("matplotlib", reason="dgemm bench plot needs matplotlib (the plot and test extras have it)")


def record(dtype, seconds):
    rows = []
    for g, s in seconds.items():
        rows.append({"gpus": g, "seconds": s, "tflops": 2 * 64**3 / s / 1e12 if s else None,
                     "speedup": seconds[1] / s if s else None, "efficiency": seconds[1] / s / g if s else None})
    return {"dtype": dtype, "m": 64, "n": 64, "k": 64, "device": "X", "commit": "abc", "date": "2026-11-22",
            "scaling": rows}


def test_plot_is_a_png(tmp_path):
    recs = [record("float32", {1: 4.0, 2: 2.1, 4: None}), record("float64", {1: 8.0, 2: 4.4})]
    assert plots.scaling_points(recs[0]) == [(1, recs[0]["scaling"][0]["tflops"], 1.0),
                                             (2, recs[0]["scaling"][1]["tflops"], 4.0 / 2.1 / 2)]
    path = plots.scaling_plot(recs, tmp_path / "s.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_records_without_scaling_are_refused(tmp_path):
    with pytest.raises(ValueError, match="no record has a measured scaling row"):
        plots.scaling_plot([{"dtype": "float32", "scaling": None}], tmp_path / "s.png")
    assert not (tmp_path / "s.png").exists()


def test_cli(tmp_path):
    src = tmp_path / "r.json"
    src.write_text(json.dumps(record("float32", {1: 4.0, 2: 2.0})))
    r = CliRunner().invoke(cli, ["bench", "plot", str(src), "--out", str(tmp_path / "p.png")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "p.png").stat().st_size > 10_000
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"dtype": "float32", "scaling": []}))
    r = CliRunner().invoke(cli, ["bench", "plot", str(bad), "--out", str(tmp_path / "q.png")])
    assert r.exit_code != 0 and "no record has a measured scaling row" in r.output
