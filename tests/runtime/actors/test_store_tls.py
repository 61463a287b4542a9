"""The rendezvous store behind mutual TLS (rpeg.runtime.actors.store_tls): a rank with the
cluster's certificate reaches it and a gloo group forms through it; a plaintext client, a
client whose certificate another CA signed, and a rank without TLS files do not get in."""

from __future__ import annotations

import datetime
import shutil
import subprocess
import threading

import pytest
import torch

pytestmark = pytest.mark.skipif(not shutil.which("openssl"), reason="openssl is not installed")


def _cert(tmp_path, name: str):
    from rpeg.runtime.actors.store_tls import TlsFiles

    cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", f"/CN={name}"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return TlsFiles(str(cert), str(cert), str(key))  # self-signed: its own CA


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    return _cert(d, "cluster"), _cert(d, "stranger")


@pytest.fixture
def fronted(certs):
    """A store master on loopback behind a TLS front on 127.0.0.1: (store, its address)."""
    from rpeg.runtime.actors.rendezvous import _tcp_master
    from rpeg.runtime.actors.store_tls import tls_front

    store = _tcp_master("127.0.0.1", 30.0)
    front = tls_front("127.0.0.1", store.port, certs[0])
    yield store, f"tls:127.0.0.1:{front.port}", front.port
    front.close()


def test_a_rank_with_the_cluster_certificate_reads_and_writes(certs, fronted):
    from rpeg.runtime.actors.rendezvous import join_store

    store, addr, _ = fronted
    client = join_store(addr, timeout_s=20.0, tls=certs[0])
    client.set("from-client", b"1")
    store.set("from-master", b"2")
    assert store.get("from-client") == b"1"
    assert client.get("from-master") == b"2"
    assert client.add("n", 3) == 3 and store.add("n", 4) == 7


def test_a_gloo_group_forms_through_the_tls_store(certs, fronted):
    from rpeg.runtime.actors.rendezvous import join_store, standalone_group

    store, addr, _ = fronted
    out: dict[int, torch.Tensor] = {}

    def rank(r: int) -> None:
        st = store if r == 0 else join_store(addr, timeout_s=20.0, tls=certs[0])
        pg = standalone_group(st, "g", r, 2, "gloo", 30.0)
        t = torch.tensor([float(r + 1)])
        pg.allreduce([t]).wait()
        out[r] = t

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert out[0].item() == out[1].item() == 3.0


def test_plaintext_and_foreign_certificates_are_refused(certs, fronted):
    import torch.distributed as dist

    from rpeg.runtime.actors.rendezvous import join_store

    store, addr, port = fronted
    store.set("secret", b"x")
    quick = datetime.timedelta(seconds=1)
    with pytest.raises((RuntimeError, TimeoutError, OSError)):  # TLS front: no plain store
        plain = dist.TCPStore("127.0.0.1", port, None, False, quick)
        plain.get("secret")
    with pytest.raises((RuntimeError, TimeoutError, OSError)):  # another CA's certificate
        foreign = join_store(addr, timeout_s=1.0, tls=certs[1])
        foreign.get("secret")


def test_a_rank_without_tls_files_is_told_which_fields(fronted):
    from rpeg.errors import RpegError
    from rpeg.runtime.actors.rendezvous import join_store

    with pytest.raises(RpegError, match="cluster.tls_ca_file / tls_cert_file / tls_key_file"):
        join_store(fronted[1], timeout_s=3.0)


def test_tls_files_come_from_the_cluster_section():
    from types import SimpleNamespace

    from rpeg.runtime.actors.store_tls import TlsFiles, tls_files

    full = SimpleNamespace(tls_ca_file="ca", tls_cert_file="c", tls_key_file="k")
    assert tls_files(full) == TlsFiles("ca", "c", "k")
    assert tls_files(SimpleNamespace(tls_ca_file="ca", tls_cert_file=None)) is None
