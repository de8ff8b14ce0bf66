"""A real S3-compatible server for the tests: moto's, run as a process of its own on 127.0.0.1.

The ``s3`` fixture (session-scoped, imported by conftest.py) starts
moto's ``ThreadedMotoServer``, in a process of its own, on a free port (:func:`dgemm.benchmarks.objectstore.start_moto`,
as ``dgemm bench e2e --store s3://...`` does) with IAM authentication enforced,
creates a user with an access key and a bucket, and yields an
:class:`S3Server`.  Credentials and endpoint reach dgemm (and its workers)
only through :attr:`S3Server.storage_options`: ``AWS_*`` variables are
removed from the test process for the session, so a client or worker that
does not get the storage options cannot reach the data.
"""
from __future__ import annotations

import json
import os
import subprocess
import uuid
from dataclasses import dataclass

import pytest

from dgemm.benchmarks.objectstore import REGION, start_moto, stop_process

# The IAM calls that set up the user and its key run before moto starts checking signatures.
_SETUP_CALLS = 3
_ALLOW_ALL = json.dumps({"Version": "2012-10-17",
                         "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]})


@dataclass(frozen=True)
class S3Server:
    """A running moto server: its endpoint, a bucket, and the storage options that reach it."""

    endpoint: str
    bucket: str
    key: str
    secret: str
    proc: subprocess.Popen

    @property
    def storage_options(self) -> dict:
        """What s3fs (through ``storage_options=``) needs: credentials, endpoint, region."""
        return {"key": self.key, "secret": self.secret, "endpoint_url": self.endpoint,
                "client_kwargs": {"region_name": REGION}}

    def url(self, name: str) -> str:
        """``s3://<bucket>/<name>``."""
        return f"s3://{self.bucket}/{name}"

    def fs(self):
        """An s3fs filesystem on this server (for tests that touch objects directly)."""
        import s3fs
        return s3fs.S3FileSystem(**self.storage_options)


def start(log) -> S3Server:
    """Start moto's server (a subprocess), create a user, its key and a bucket; ``log`` gets its output."""
    import boto3

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(_SETUP_CALLS)   # then every request must be signed by a known key
    endpoint, proc = start_moto(log, env)
    try:
        anyone = {"endpoint_url": endpoint, "region_name": REGION,
                  "aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
        iam = boto3.client("iam", **anyone)
        iam.create_user(UserName="dgemm-tests")
        key = iam.create_access_key(UserName="dgemm-tests")["AccessKey"]
        iam.put_user_policy(UserName="dgemm-tests", PolicyName="all", PolicyDocument=_ALLOW_ALL)
        bucket = f"dgemm-tests-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", **dict(anyone, aws_access_key_id=key["AccessKeyId"],
                                  aws_secret_access_key=key["SecretAccessKey"])).create_bucket(Bucket=bucket)
    except BaseException:
        stop(proc)
        raise
    return S3Server(endpoint, bucket, key["AccessKeyId"], key["SecretAccessKey"], proc)


def stop(proc: subprocess.Popen) -> None:
    stop_process(proc)


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A moto S3 server on 127.0.0.1 for the session (skipped without moto[server] and s3fs)."""
    for module in ("moto.server", "s3fs", "boto3"):
        pytest.importorskip(module, reason=f"the S3 tests need {module}: pip install -e '.[test]' "
                                           "(moto[server] and s3fs)")
    # Credentials must reach dgemm through storage_options only: no AWS_* in this process (nor,
    # through the elsewhere fixture's copy of this environment, in its cluster).
    saved = {k: os.environ.pop(k) for k in [k for k in os.environ if k.startswith("AWS_")]}
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "w+")
    try:
        server = start(log)
        try:
            yield server
        finally:
            stop(server.proc)
    finally:
        log.close()
        os.environ.update(saved)
