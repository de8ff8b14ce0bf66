"""Settings (dgemm.config): where a value comes from, what a bad one says, how it reaches a worker."""
from __future__ import annotations

import copy
from pathlib import Path

import dask
import pytest
import yaml

from conftest import DEVICES
from dgemm import config


@pytest.fixture
def clean(monkeypatch):
    """No DGEMM_* variable set, and Dask's configuration as it was after the test."""
    for s in config.SETTINGS.values():
        monkeypatch.delenv(s.env, raising=False)
    saved = copy.deepcopy(dask.config.config)
    yield
    dask.config.config.clear()
    dask.config.config.update(saved)


def test_defaults(clean):
    assert config.get("worker-timeout") == 60
    assert config.get("pinned-bytes") == 4 << 30
    assert config.get("read-threads") is None and config.get("devices") is None
    with dask.config.set({"dgemm.pinned-bytes": None}):          # null: the shipped default
        assert config.get("pinned-bytes") == 4 << 30


def test_precedence(clean, tmp_path, monkeypatch):
    """Shipped default < user YAML < DASK_DGEMM__* < dask.config.set < DGEMM_*."""
    (tmp_path / "dgemm.yaml").write_text(yaml.safe_dump({"dgemm": {"read-threads": 2, "worker-timeout": "90s"}}))
    dask.config.refresh(paths=[str(tmp_path)], env={})
    assert config.get("read-threads") == 2 and config.get("worker-timeout") == 90
    assert config.get("pinned-bytes") == 4 << 30                  # the YAML leaves the others alone
    dask.config.refresh(paths=[str(tmp_path)], env={"DASK_DGEMM__READ_THREADS": "5",
                                                     "DASK_DGEMM__DEVICE_MEMORY_LIMIT": "2GiB"})
    assert config.get("read-threads") == 5 and config.get("device-memory-limit") == 2 << 30
    with dask.config.set({"dgemm.read-threads": 6}):
        assert config.get("read-threads") == 6
        monkeypatch.setenv("DGEMM_READ_THREADS", "7")
        assert config.get("read-threads") == 7
        monkeypatch.setenv("DGEMM_READ_THREADS", " ")            # empty: as if unset
        assert config.get("read-threads") == 6


def test_variable_names():
    s = config.SETTINGS["device-memory-limit"]
    assert (s.env, s.dask_env) == ("DGEMM_DEVICE_MEMORY_LIMIT", "DASK_DGEMM__DEVICE_MEMORY_LIMIT")
    assert all(s.env == "DGEMM_" + s.key.upper().replace("-", "_") for s in config.SETTINGS.values())
    assert config.environment("read-threads") == "DGEMM_READ_THREADS"
    # every setting has a shipped default (null or a value) in dgemm.yaml, and nothing else is there
    assert set(config.DEFAULTS["dgemm"]) == set(config.SETTINGS)


@pytest.mark.parametrize("key, value, message", [
    ("read-threads", "0", "DGEMM_READ_THREADS='0' must be a positive integer"),
    ("prefetch", "four", "DGEMM_PREFETCH='four' must be a positive integer"),
    ("device-memory-limit", "lots", "DGEMM_DEVICE_MEMORY_LIMIT='lots' is not a size in bytes"),
    ("device-memory-limit", "0", "DGEMM_DEVICE_MEMORY_LIMIT='0' must be more than 0 bytes"),
    ("pinned-bytes", "-1", "DGEMM_PINNED_BYTES='-1' is not a size in bytes"),
    ("worker-timeout", "soon", "DGEMM_WORKER_TIMEOUT='soon' is not a duration"),
    ("worker-timeout", "0", "DGEMM_WORKER_TIMEOUT='0' is not a duration"),
])
def test_bad_variables_name_themselves(clean, monkeypatch, key, value, message):
    monkeypatch.setenv(config.environment(key), value)
    with pytest.raises(ValueError, match=message):
        config.get(key)


def test_bad_configuration_names_the_key(clean):
    with dask.config.set({"dgemm.read-threads": 2.5}):
        with pytest.raises(ValueError, match=r"dgemm.read-threads=2.5 must be a positive integer"):
            config.get("read-threads")
    with dask.config.set({"dgemm.worker-timeout": True}):
        with pytest.raises(ValueError, match="dgemm.worker-timeout=True is not a duration"):
            config.get("worker-timeout")
    with pytest.raises(KeyError, match="'read_threads' is not a dgemm setting; settings: devices, device"):
        config.get("read_threads")


def test_parsed_values(clean, monkeypatch):
    monkeypatch.setenv("DGEMM_DEVICE_MEMORY_LIMIT", "512MiB")
    monkeypatch.setenv("DGEMM_WORKER_TIMEOUT", "2 minutes")
    monkeypatch.setenv("DGEMM_PINNED_BYTES", "0")                 # no page-locked memory: allowed
    monkeypatch.setenv("DGEMM_DEVICES", " cpu,cpu ")
    assert config.get("device-memory-limit") == 512 << 20 and config.get("worker-timeout") == 120
    assert config.get("pinned-bytes") == 0 and config.get("devices") == "cpu,cpu"


def test_settings_reach_their_readers(clean, monkeypatch, tmp_path):
    """The modules read settings when they act, so a later dask.config.set counts."""
    from dgemm.opencl import device, discovery, engine
    from dgemm.opencl import database

    cpu = discovery.DeviceInfo(0, 0, "P", "cpu0", "v", "CPU", 1, 1, 1, 1, True, None, "")

    with dask.config.set({"dgemm.read-threads": 3, "dgemm.pinned-bytes": "1MiB", "dgemm.prefetch": 9,
                          "dgemm.tuning-db": str(tmp_path / "t.json"), "dgemm.devices": "nothing-like-it"}):
        assert device.read_threads() == 3 and device.pinned_limit() == 1 << 20
        assert engine.default_prefetch() == 9
        assert database.user_path() == tmp_path / "t.json"
        with pytest.raises(LookupError, match="no OpenCL device matches 'nothing-like-it'"):
            discovery.select_devices(None, [cpu])
    with dask.config.set({"dgemm.read-threads": 5}):
        assert engine.default_prefetch() == 5                     # unset: one step per reader, at least 4


@pytest.mark.parametrize("raw, expected", [
    ("0.8", 0.8), (" .25 ", 0.25), ("1.0", 1.0), (0.5, 0.5),        # dask-cuda's fraction of the device
    ("4GiB", 4 << 30), ("1000", 1000), (3 << 30, 3 << 30), (4e9, 4_000_000_000),   # sizes, as before
])
def test_device_memory_limit_takes_a_fraction_or_bytes(clean, monkeypatch, raw, expected):
    monkeypatch.setenv("DGEMM_DEVICE_MEMORY_LIMIT", str(raw))
    got = config.get("device-memory-limit")
    assert got == expected and type(got) is type(expected)
    monkeypatch.delenv("DGEMM_DEVICE_MEMORY_LIMIT")
    with dask.config.set({"dgemm.device-memory-limit": raw}):
        assert config.get("device-memory-limit") == expected


@pytest.mark.parametrize("raw", ["0.0", ".0", "-0.5", "0", "lots"])
def test_device_memory_limit_refuses_what_is_neither(clean, monkeypatch, raw):
    monkeypatch.setenv("DGEMM_DEVICE_MEMORY_LIMIT", raw)
    with pytest.raises(ValueError, match="DGEMM_DEVICE_MEMORY_LIMIT"):
        config.get("device-memory-limit")


def test_a_fraction_is_resolved_against_each_device(clean):
    """The worker's device decides what 0.8 means: 0.8 of 16 GiB on one, of 6 GiB on another; bytes cap."""
    from types import SimpleNamespace

    from dgemm.worker.state import device_memory

    big, small = SimpleNamespace(global_mem=16 << 30), SimpleNamespace(global_mem=6 << 30)
    with dask.config.set({"dgemm.device-memory-limit": "0.8"}):
        assert device_memory(big) == int(0.8 * (16 << 30)) and device_memory(small) == int(0.8 * (6 << 30))
    with dask.config.set({"dgemm.device-memory-limit": "8GiB"}):
        assert device_memory(big) == 8 << 30 and device_memory(small) == 6 << 30
    assert device_memory(big) == 16 << 30


def test_readme_lists_every_setting():
    """The README's "Settings" section is the table config.settings_table() writes (paste it there)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert config.settings_table() in readme


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(not DEVICES, reason="no OpenCL device (pip install pocl-binary-distribution)")
def test_a_setting_reaches_the_workers_of_a_local_cluster(clean):
    """dask.config.set before a DeviceCluster starts: its nannies ship the configuration to each worker,
    and the cluster's own per-worker share of reader threads does not override it."""
    from distributed import Client

    from dgemm.cluster import DeviceCluster

    with dask.config.set({"dgemm.read-threads": 3}):
        with DeviceCluster("cpu,cpu", dashboard_address=":0") as cluster, \
                Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=120)
            seen = client.run(lambda: config.get("read-threads"))
    assert list(seen.values()) == [3, 3]


@pytest.mark.parametrize("raw, expected", [("on", "on"), (" OFF ", "off"), (False, "off"), ("1", "on"), ("", None),
                                           (" Inline", "inline")])
def test_queue_priority_is_a_switch_or_inline(clean, monkeypatch, raw, expected):
    monkeypatch.setenv("DGEMM_QUEUE_PRIORITY", str(raw) if not isinstance(raw, bool) else ("off", "on")[raw])
    assert config.get("queue-priority") == (expected if expected is not None else config.SETTINGS["queue-priority"].default)


def test_queue_priority_refuses_other_words(clean, monkeypatch):
    monkeypatch.setenv("DGEMM_QUEUE_PRIORITY", "high")
    with pytest.raises(ValueError, match="DGEMM_QUEUE_PRIORITY='high' must be on, off or inline"):
        config.get("queue-priority")
