"""The ranks' rendezvous store behind mutual TLS, for clusters whose Dask traffic is TLS.

torch's ``TCPStore`` (where a group's ranks exchange addresses before gloo/NCCL connect) has
no encryption and no authentication: anyone who reaches its port can read or write keys. With
``cluster.tls_*_file`` set, the store listens on loopback only, and the one listener other hosts
reach is a TLS front that forwards each authenticated connection to it; every other rank talks
to a local plaintext port whose connections are forwarded over TLS (a stunnel-like pair, one
thread per direction of each connection). Both ends present the cluster's certificate and
check the peer's against its CA bundle (the files Dask's ``Security`` uses), so a peer without
a certificate the CA signed is refused at the handshake. Host names are not checked (Dask's
default: clusters address workers by IP).

What this does not cover: NCCL's and gloo's own traffic after the rendezvous (docs/operating.md).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass

#: bytes moved per read when forwarding
CHUNK = 1 << 16


@dataclass(frozen=True)
class TlsFiles:
    """The cluster's CA bundle, certificate and key (``cluster.tls_*_file``)."""

    ca_file: str
    cert_file: str
    key_file: str

    def context(self, server: bool) -> ssl.SSLContext:
        purpose = ssl.Purpose.CLIENT_AUTH if server else ssl.Purpose.SERVER_AUTH
        ctx = ssl.create_default_context(purpose, cafile=self.ca_file)
        ctx.check_hostname = False  # peers are addressed by IP (as Dask's TLS)
        ctx.verify_mode = ssl.CERT_REQUIRED  # both ends: mutual TLS
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


def tls_files(cluster: object) -> TlsFiles | None:
    """The run's TLS files from its cluster config section, or None when it has none."""
    ca = getattr(cluster, "tls_ca_file", None)
    cert = getattr(cluster, "tls_cert_file", None)
    key = getattr(cluster, "tls_key_file", None)
    return TlsFiles(ca, cert, key) if ca and cert and key else None


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


def _join(a: socket.socket, b: socket.socket) -> None:
    for src, dst in ((a, b), (b, a)):
        threading.Thread(target=_pipe, args=(src, dst), daemon=True).start()


class _Forwarder:
    """A listener whose every accepted connection is joined to a new outgoing one."""

    def __init__(
        self,
        listen: socket.socket,
        accept_wrap: Callable[[socket.socket], socket.socket],
        connect: Callable[[], socket.socket],
    ):
        self._listen = listen
        self._accept_wrap = accept_wrap
        self._connect = connect
        self.port = listen.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listen.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            inbound = self._accept_wrap(conn)
            outbound = self._connect()
        except (OSError, ssl.SSLError):  # a peer without a valid certificate, or gone
            with contextlib.suppress(OSError):
                conn.close()
            return
        _join(inbound, outbound)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listen.close()


def _listener(host: str) -> socket.socket:
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, 0))
        s.listen(256)
    except OSError:
        s.close()
        raise
    return s


def tls_front(host: str, store_port: int, files: TlsFiles) -> _Forwarder:
    """The TLS listener on ``host`` (port chosen by the OS) in front of the store on
    ``127.0.0.1:store_port``: a connection is forwarded only after its TLS handshake proved a
    certificate the CA signed."""
    ctx = files.context(server=True)

    def accept(conn: socket.socket) -> socket.socket:
        conn.settimeout(30.0)  # a handshake that never completes does not hold a thread
        tls = ctx.wrap_socket(conn, server_side=True)
        tls.settimeout(None)
        return tls

    def connect() -> socket.socket:
        return socket.create_connection(("127.0.0.1", store_port))

    return _Forwarder(_listener(host), accept, connect)


def tls_back(host: str, port: int, files: TlsFiles) -> _Forwarder:
    """A plaintext listener on ``127.0.0.1`` (port chosen by the OS) whose connections go to
    the TLS front at ``host:port`` (this rank's TCPStore client connects to it)."""
    ctx = files.context(server=False)

    def connect() -> socket.socket:
        raw = socket.create_connection((host, port), timeout=30.0)
        tls = ctx.wrap_socket(raw, server_hostname=host)
        tls.settimeout(None)
        return tls

    return _Forwarder(_listener("127.0.0.1"), lambda conn: conn, connect)
