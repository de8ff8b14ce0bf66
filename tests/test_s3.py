"""S3 through ``storage_options=``: inputs, outputs, resume, ``open_result`` and the CLI on a real S3 server.

The server is moto's, run by the ``s3`` fixture (tests/s3server.py) as its
own process on 127.0.0.1 with request signatures checked.  The workers are
those of the ``elsewhere`` fixture: a ``dgemm cluster`` in its own folder and
an environment without ``AWS_*`` variables, so they reach the bucket only
with the storage options that travel with the call (inside the opened
arrays).  The arrays are small: these tests run in CI on two cores.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import dgemm
from _check import check_product, randn
from dgemm.cli import cli
from dgemm.storage import COMPLETE_ATTR


def put(s3, name: str, data: np.ndarray, chunks, **kw) -> str:
    """Write ``data`` as the Zarr array ``s3://<bucket>/<name>``; returns its URL."""
    url = s3.url(name)
    arr = zarr.create_array(url, shape=data.shape, chunks=chunks, dtype=data.dtype,
                            storage_options=s3.storage_options, **kw)
    arr[...] = data
    return url


def read(s3, url: str) -> np.ndarray:
    return zarr.open_array(url, mode="r", storage_options=s3.storage_options)[...]


def exists(s3, url: str) -> bool:
    fs = s3.fs()
    fs.invalidate_cache()
    return fs.exists(url)


def cluster_idle(client) -> bool:
    """No task assigned to or running on any worker."""
    assigned = client.run_on_scheduler(
        lambda dask_scheduler: sum(len(ws.processing) for ws in dask_scheduler.workers.values()))
    running = client.run(lambda dask_worker: len(dask_worker.state.executing))
    return assigned == 0 and not any(running.values())


# -- on the workers ---------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_matmul_s3_inputs_and_out_reach_the_workers_only_through_storage_options(s3, elsewhere, tmp_path,
                                                                                  monkeypatch, rng, dtype):
    """A, B and C on S3; the workers have no credentials nor endpoint but those of ``storage_options``."""
    monkeypatch.chdir(tmp_path)
    A, B = randn(rng, (96, 64), dtype), randn(rng, (64, 80), dtype)
    a, b = put(s3, f"mm-{dtype}/a.zarr", A, (32, 32)), put(s3, f"mm-{dtype}/b.zarr", B, (32, 32))
    out = s3.url(f"mm-{dtype}/c.zarr")

    # Without the options a worker cannot read the data: what it reaches, storage_options brought.
    def settings_and_a_read_without_options(url):
        import os
        import zarr
        try:
            zarr.open_array(url, mode="r")[...]
            read = "read"
        except Exception as e:
            read = type(e).__name__
        return sorted(k for k in os.environ if k.startswith("AWS_")), read

    seen = elsewhere.client.run(settings_and_a_read_without_options, a)
    assert seen and all(env == [] and read != "read" for env, read in seen.values()), seen

    result = dgemm.matmul(a, b, out=out, client=elsewhere.client, block=32, storage_options=s3.storage_options)
    assert result.attrs[COMPLETE_ATTR]["complete"] is True
    check_product(read(s3, out), A, B, dtype=dtype)
    # the secret travels inside the opened arrays, never into the output's attributes
    assert s3.secret not in str(result.attrs.asdict())


def test_gemm_all_on_s3(s3, elsewhere, tmp_path, monkeypatch, rng):
    """``alpha * a @ b.T + beta * c`` with a, b, c and out on S3, in float64."""
    monkeypatch.chdir(tmp_path)
    A, B, C = randn(rng, (64, 96)), randn(rng, (80, 96)), randn(rng, (64, 80))
    a, b, c = (put(s3, f"gemm/{n}.zarr", x, (32, 32)) for n, x in (("a", A), ("b", B), ("c", C)))
    out = s3.url("gemm/out.zarr")
    result = dgemm.gemm(a, b, c, alpha=-0.5, beta=2.0, trans_b=True, out=out, client=elsewhere.client,
                        block=32, storage_options=s3.storage_options)
    assert result.attrs[COMPLETE_ATTR]["complete"] is True
    check_product(read(s3, out), A, B, c=C, alpha=-0.5, beta=2.0, trans_b=True, dtype="float64")
    np.testing.assert_array_equal(read(s3, c), C)   # c is only read


def test_resume_and_open_result_on_s3(s3, elsewhere, tmp_path, monkeypatch, rng):
    """A run that failed on an unreadable S3 chunk is refused by ``open_result`` and then resumed.

    The output's block markers are S3 objects: the resumed run lists them
    through the storage options and computes only the blocks without one.
    """
    monkeypatch.chdir(tmp_path)
    A, B = randn(rng, (128, 64)), randn(rng, (64, 96))
    a = put(s3, "resume/a.zarr", A, (32, 64), compressors=None)
    b = put(s3, "resume/b.zarr", B, (64, 32))
    out = s3.url("resume/c.zarr")
    fs = s3.fs()
    chunk = f"{s3.bucket}/resume/a.zarr/c/3/0"
    good = fs.cat_file(chunk)
    fs.pipe_file(chunk, b"broken")
    opts = s3.storage_options
    with pytest.raises(OSError, match=r"could not read Zarr array .*a\.zarr.*rows \d+:128"):
        dgemm.matmul(a, b, out=out, client=elsewhere.client, block=32, storage_options=opts)
    deadline = time.monotonic() + 60
    while not cluster_idle(elsewhere.client):
        assert time.monotonic() < deadline, "the failed run's tasks did not drain"
        time.sleep(0.05)
    with pytest.raises(dgemm.IncompleteResultError, match="is incomplete"):
        dgemm.open_result(out, storage_options=opts)
    records = f"{s3.bucket}/resume/c.zarr/.dgemm"
    fs.invalidate_cache()
    marked = [k for k in fs.find(records) if "/.dgemm/done/" in k]   # kept for resume: it skips those blocks
    fs.pipe_file(chunk, good)
    result = dgemm.matmul(a, b, out=out, client=elsewhere.client, block=32, resume=True, storage_options=opts)
    meta = result.attrs[COMPLETE_ATTR]
    print(f"resume ran {meta['blocks_run']} of {meta['blocks']} blocks")
    assert meta["complete"] is True and meta["resumed"] is True and meta["blocks_run"] == 12 - len(marked)
    done = dgemm.open_result(out, storage_options=opts)
    check_product(done[...], A, B, dtype="float64")
    fs.invalidate_cache()
    assert fs.find(records) == []   # finished: as clean as to_zarr leaves one, the attribute alone records the run
    # resuming a finished output does nothing and returns it
    again = dgemm.matmul(a, b, out=out, client=elsewhere.client, resume=True, storage_options=opts)
    assert again.attrs[COMPLETE_ATTR]["blocks_run"] == meta["blocks_run"]


def test_layout_options_on_s3_are_recorded_as_zarr_records_them(s3, elsewhere, tmp_path, monkeypatch, rng):
    """chunks, shards, dimension_names and attributes of an S3 out, written by the workers: the metadata is
    zarr's own for the same options, the default chunks are the inputs', and no .dgemm object is left."""
    monkeypatch.chdir(tmp_path)
    A, B = randn(rng, (96, 64)), randn(rng, (64, 80))
    a, b = put(s3, "layout/a.zarr", A, (32, 32)), put(s3, "layout/b.zarr", B, (32, 40))
    opts, fs = s3.storage_options, s3.fs()
    layout = dict(chunks=(16, 20), shards=(32, 40), dimension_names=("i", "j"), attributes={"units": "m"})
    out = s3.url("layout/c.zarr")
    dgemm.matmul(a, b, out=out, client=elsewhere.client, block=32, storage_options=opts, **layout)
    got = zarr.open_array(out, mode="r", storage_options=opts)
    check_product(got[...], A, B, dtype="float64")
    assert got.chunks == (16, 20) and got.shards == (32, 40) and got.metadata.dimension_names == ("i", "j")
    ref = zarr.create_array(s3.url("layout/ref.zarr"), shape=(96, 80), dtype="float64", fill_value=0,
                            storage_options=opts, **layout)
    mine = got.metadata.to_dict()
    assert mine["attributes"].pop(COMPLETE_ATTR)["complete"] is True
    assert mine == ref.metadata.to_dict()
    plain = s3.url("layout/plain.zarr")
    dgemm.matmul(a, b, out=plain, client=elsewhere.client, storage_options=opts)
    assert zarr.open_array(plain, mode="r", storage_options=opts).chunks == (32, 40)   # rows of a's, columns of b's
    fs.invalidate_cache()
    assert fs.find(f"{s3.bucket}/layout/c.zarr/.dgemm") == fs.find(f"{s3.bucket}/layout/plain.zarr/.dgemm") == []


def test_cli_storage_option(s3, elsewhere, tmp_path, monkeypatch, rng):
    """``dgemm matmul s3://... --storage-option KEY=VALUE ...`` on a scheduler; dotted keys nest."""
    monkeypatch.chdir(tmp_path)
    A, B = randn(rng, (64, 48)), randn(rng, (48, 40))
    a, b = put(s3, "cli/a.zarr", A, (32, 32)), put(s3, "cli/b.zarr", B, (32, 32))
    out = s3.url("cli/c.zarr")
    options = [f"key={s3.key}", f"secret={s3.secret}", f"endpoint_url={s3.endpoint}",
               f"client_kwargs.region_name={s3.storage_options['client_kwargs']['region_name']}"]
    args = ["matmul", a, b, out, "--scheduler", elsewhere.client.scheduler.address, "--no-progress",
            "--block", "32"] + [x for o in options for x in ("--storage-option", o)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert f"written to: {out}" in r.output
    check_product(dgemm.open_result(out, storage_options=s3.storage_options)[...], A, B, dtype="float64")


# -- refused before any work ------------------------------------------------------
def test_bad_credentials_and_missing_buckets_are_refused_before_any_work(s3, tmp_path, rng, no_client):
    """Wrong secret, no options, an unknown bucket: a clear error naming the URL, and nothing written."""
    A = randn(rng, (32, 32))
    a = put(s3, "errors/a.zarr", A, (32, 32))
    local = str(tmp_path / "b.zarr")
    zarr.create_array(local, shape=(32, 32), chunks=(32, 32), dtype="float64")[...] = A
    good, bad = s3.storage_options, dict(s3.storage_options, secret="not-the-secret")
    out = s3.url("errors/c.zarr")
    with pytest.raises(ValueError, match=r"a: s3://.*errors/a\.zarr .*\(PermissionError.*"
                                         r"check storage_options"):
        dgemm.matmul(a, local, out=out, client=no_client, storage_options=bad)
    with pytest.raises(ValueError, match=r"a: s3://.*storage_options= gives its filesystem"):
        dgemm.matmul(a, local, out=out, client=no_client)
    with pytest.raises(ValueError, match=r"out 's3://.*errors/c\.zarr': cannot reach .*PermissionError.*"
                                         r"check storage_options"):
        dgemm.matmul(local, local, out=out, client=no_client, storage_options=bad)
    with pytest.raises(ValueError, match=r"out 's3://no-such-bucket-\w+/c\.zarr': 'no-such-bucket-\w+' does not "
                                         r"exist"):
        dgemm.matmul(a, local, out=f"s3://no-such-bucket-{os.getpid()}/c.zarr", client=no_client,
                     storage_options=good)
    with pytest.raises(ValueError, match=r"cannot open|is not a Zarr array"):
        dgemm.gemm(a, local, f"s3://no-such-bucket-{os.getpid()}/c.zarr", beta=1.0, out=out, client=no_client,
                   storage_options=good)
    assert not exists(s3, out)
    with pytest.raises(ValueError, match=r"cannot open s3://.*PermissionError.*check storage_options"):
        dgemm.open_result(a, storage_options=bad)


def test_storage_options_that_cannot_apply_are_refused(s3, tmp_path, rng, no_client):
    """Local paths, opened arrays and stores only: refused, as zarr refuses options it cannot use."""
    A = randn(rng, (32, 32))
    path = str(tmp_path / "a.zarr")
    arr = zarr.create_array(path, shape=A.shape, chunks=(32, 32), dtype=A.dtype)
    arr[...] = A
    opts = s3.storage_options
    for a, b, out in ((path, path, str(tmp_path / "c.zarr")), (arr, A, None), (arr, path, zarr.storage.LocalStore(
            str(tmp_path / "d.zarr")))):
        with pytest.raises(ValueError, match=r"storage_options= applies to URLs such as 's3://bucket/a\.zarr', "
                                             r"and none of a, b(, out)? is one"):
            dgemm.matmul(a, b, out=out, client=no_client, storage_options=opts)
    with pytest.raises(TypeError, match="storage_options must be a dict"):
        dgemm.matmul(s3.url("x.zarr"), path, client=no_client, storage_options="anon=true")
    with pytest.raises(ValueError, match="storage_options= applies to a URL"):
        dgemm.open_result(path, storage_options=opts)
    assert not os.path.exists(tmp_path / "c.zarr") and not os.path.exists(tmp_path / "d.zarr")


def _credentials_only_here(s3, monkeypatch, tmp_path, rng, prefix: str):
    """A and B on the server, out's URL, and the server's credentials in this process's environment only."""
    monkeypatch.chdir(tmp_path)
    A, B = randn(rng, (64, 48)), randn(rng, (48, 40))
    a, b = put(s3, f"{prefix}/a.zarr", A, (32, 32)), put(s3, f"{prefix}/b.zarr", B, (32, 32))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.key)         # this process's, not the workers'
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret)
    return A, B, a, b, s3.url(f"{prefix}/c.zarr")


def test_credentials_only_this_process_has_are_refused_before_any_work(s3, elsewhere, tmp_path, monkeypatch, rng):
    """Credentials in the client's environment only: the client's checks passed, then every worker failed
    with NoCredentialsError.  The workers' own access, with the options the run sends, is checked first:
    one line naming the URL, the worker and the fix, exit 2, nothing written; the same with key and secret
    given works."""
    A, B, a, b, out = _credentials_only_here(s3, monkeypatch, tmp_path, rng, "envonly")
    region = s3.storage_options["client_kwargs"]["region_name"]
    where = ["--storage-option", f"endpoint_url={s3.endpoint}", "--storage-option",
             f"client_kwargs.region_name={region}"]
    from dgemm.cluster import check_worker_access
    partial = {k: v for k, v in s3.storage_options.items() if k not in ("key", "secret")}
    with pytest.raises(ValueError, match=r"the workers cannot open b \(s3://.*envonly/b\.zarr\) .*NoCredentialsError.*"
                                         r"give them with storage_options= \(s3fs: key, secret\)"):
        check_worker_access(elsewhere.client, {"a": "local.zarr", "b": b}, partial)
    check_worker_access(elsewhere.client, {"a": a, "b": b, "out": out}, s3.storage_options)   # all there: passes
    args = ["matmul", a, b, out, "--scheduler", elsewhere.client.scheduler.address, "--no-progress", "--block", "32"]
    r = CliRunner().invoke(cli, args + where)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    assert lines[0].startswith(f"Error: the workers cannot open a ({a}) with the storage options this run sends "
                               "them: tcp://"), r.output
    assert "NoCredentialsError" in lines[0] and "--storage-option key=... --storage-option secret=..." in lines[0]
    assert not exists(s3, out)
    assert cluster_idle(elsewhere.client)
    credentials = ["--storage-option", f"key={s3.key}", "--storage-option", f"secret={s3.secret}"]
    r = CliRunner().invoke(cli, args + where + credentials)
    assert r.exit_code == 0, r.output
    check_product(dgemm.open_result(out, storage_options=s3.storage_options)[...], A, B, dtype="float64")


def test_credentials_only_this_process_has_are_refused_by_the_library_too(s3, elsewhere, tmp_path, monkeypatch,
                                                                           rng):
    """dgemm.matmul(..., client=) from Python: the same refusal before any work as the command line's, nothing
    written; with key and secret in storage_options the same call works."""
    A, B, a, b, out = _credentials_only_here(s3, monkeypatch, tmp_path, rng, "envlib")
    partial = {k: v for k, v in s3.storage_options.items() if k not in ("key", "secret")}
    with pytest.raises(ValueError, match=r"the workers cannot open a \(s3://.*envlib/a\.zarr\) .*NoCredentialsError"):
        dgemm.matmul(a, b, out=out, client=elsewhere.client, storage_options=partial, block=32)
    assert not exists(s3, out)
    assert cluster_idle(elsewhere.client)
    c = dgemm.matmul(a, b, out=out, client=elsewhere.client, storage_options=s3.storage_options, block=32)
    check_product(c[...], A, B, dtype="float64")


@pytest.mark.parametrize("option, message", [
    ("noequals", "'noequals' is not KEY=VALUE"),
    ("=x", "'=x' is not KEY=VALUE"),
    ("anon=true", "--storage-option applies to URLs"),        # parsed (a bool), but no input is a URL
])
def test_cli_storage_option_errors(tmp_path, monkeypatch, option, message):
    import dgemm.cluster
    import dgemm.cluster.local

    def refuse(*args, **kwargs):
        raise AssertionError("a local cluster was started before the arguments were checked")
    monkeypatch.setattr(dgemm.cluster, "local_client", refuse)
    monkeypatch.setattr(dgemm.cluster.local, "local_client", refuse)
    path = str(tmp_path / "a.zarr")
    zarr.create_array(path, shape=(8, 8), chunks=(8, 8), dtype="float64")[...] = 1.5
    r = CliRunner().invoke(cli, ["matmul", path, path, str(tmp_path / "c.zarr"), "--no-progress",
                                 "--storage-option", option])
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert not os.path.exists(tmp_path / "c.zarr")
