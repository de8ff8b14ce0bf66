#!/usr/bin/env python3
"""Make a private certificate authority and the certificates of a TLS Dask cluster.

    python deploy/tls/make_certs.py /etc/dgemm/tls --host scheduler.example.org --host 10.0.0.5

writes into the folder (keys readable by their owner only):

    ca.pem                  the authority every side trusts (public)
    node.pem, node-key.pem  the scheduler's and workers' certificate and key
    client.pem, client-key.pem  a client's certificate and key

Every side of a Dask TLS cluster presents a certificate and accepts only peers
whose certificate this authority signed, so a client without one (or with one
from another authority) is refused.  Keep ``ca-key.pem`` (also written) off
the cluster: it signs new certificates.  Needs ``cryptography``
(``pip install cryptography``).
"""
from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
from pathlib import Path


def _name(common_name: str):
    from cryptography.x509.oid import NameOID
    from cryptography import x509
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "dgemm cluster"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key) -> None:
    from cryptography.hazmat.primitives import serialization
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_cert(path: Path, cert) -> None:
    from cryptography.hazmat.primitives import serialization
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _sign(subject_cn: str, key, ca_cert, ca_key, days: int, hosts: list[str], *, ca: bool = False,
          usage=None):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(_name(subject_cn))
               .issuer_name(ca_cert.subject if ca_cert is not None else _name(subject_cn))
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if hosts:
        names = []
        for h in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                names.append(x509.DNSName(h))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key if ca_key is not None else key, hashes.SHA256())


def make_certs(folder, hosts: list[str] | None = None, days: int = 365) -> dict[str, Path]:
    """Write ``ca.pem``, ``node.pem``/``node-key.pem`` and ``client.pem``/``client-key.pem`` into ``folder``."""
    from cryptography.x509.oid import ExtendedKeyUsageOID as EKU

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hosts = ["localhost", "127.0.0.1", *(hosts or [])]
    ca_key = _key()
    ca_cert = _sign("dgemm cluster CA", ca_key, None, None, days, [], ca=True)
    node_key, client_key = _key(), _key()
    # Nodes (scheduler, workers) both accept and open connections: server and client auth.
    node = _sign("dgemm node", node_key, ca_cert, ca_key, days, hosts, usage=[EKU.SERVER_AUTH, EKU.CLIENT_AUTH])
    client = _sign("dgemm client", client_key, ca_cert, ca_key, days, [], usage=[EKU.CLIENT_AUTH])
    paths = {name: folder / name for name in ("ca.pem", "ca-key.pem", "node.pem", "node-key.pem", "client.pem",
                                              "client-key.pem")}
    _write_cert(paths["ca.pem"], ca_cert)
    _write_key(paths["ca-key.pem"], ca_key)
    _write_cert(paths["node.pem"], node)
    _write_key(paths["node-key.pem"], node_key)
    _write_cert(paths["client.pem"], client)
    _write_key(paths["client-key.pem"], client_key)
    return paths


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="where to write the certificates (created if missing)")
    parser.add_argument("--host", action="append", default=[],
                        help="a host name or IP address of the scheduler or a worker (repeatable; "
                             "localhost and 127.0.0.1 are always included)")
    parser.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    args = parser.parse_args(argv)
    for name, path in make_certs(args.folder, args.host, args.days).items():
        print(f"{name:15} {path}")


if __name__ == "__main__":
    main()
