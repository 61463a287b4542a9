"""A direct byte channel between the two ranks of a same-host process-group pair.

Every sum of a tensor-parallel pair (two per decoder block forward, two in backward) and the
pair reductions of data-parallel statistics are one exchange of a tensor with the other
rank (:func:`rpeg.runtime.parallel.pair_exchange`). Over gloo that exchange is handed to
gloo's device thread on each side, which must be scheduled to move the bytes and then
wake the calling thread: with more ranks than cores (4 ranks of ``configs/sharded-cpu.yaml``
on the 2-core CI machine) those hand-offs wait for a core. Measured there, 4 ranks, two
pairs, a 16 KiB exchange between small matmuls (a micro-benchmark recorded in
docs/measurements.md; design: docs/ranks.md "Same-host pair channel"): gloo 2.3 ms wall / 0.56 ms CPU per iteration,
this channel 0.76 ms / 0.155 ms; an exchange alone 308 us vs 20 us.

:class:`PairChannel` is a connected Unix stream socket (Linux abstract namespace: no file,
scoped to the network namespace, so ranks in different namespaces -- the multi-host tests'
"hosts" -- never share one) for 16-byte headers, and shared memory for the bytes: each rank
writes what it sends into its own ``memfd`` region, whose descriptor went to the peer over the
socket (``SCM_RIGHTS``) when the region was made, and the peer reads -- or adds -- them
straight from there (:meth:`PairChannel.exchange`, :meth:`PairChannel.exchange_sum`; the
regions: :mod:`rpeg.runtime.shared_region`). Both
ranks of a pair must call :func:`pair_channel` (the first call on a group is a collective
that opens the channel, or agrees there is none) and then every exchange in the same order,
with tensors of the same size -- the contract of any collective (a size mismatch is a
``ValueError`` on both ranks).

Safety: the channel carries raw tensor bytes of the size and dtype the receiver already
expects; nothing received is unpickled or executed. The regions are anonymous (``memfd``: no
name in any file system), reachable only through the two processes' descriptors, as their
own memory is.
"""

from __future__ import annotations

import math
import os
import secrets
import socket
import sys
import threading
import zlib
from typing import Any

import torch

from rpeg.runtime.shared_region import SharedRegion

#: seconds an exchange waits for the other rank before raising, where the group's own
#: timeout (what its gloo collectives wait) cannot be read
PAIR_TIMEOUT_S = 600.0
#: seconds the listening rank waits for the other to connect (it got the name just before)
_CONNECT_TIMEOUT_S = 60.0

#: the most bytes one exchange moves at a time (larger tensors go in chunks): bounds the
#: shared memory of a channel to 2 regions of this size per rank
CHUNK_BYTES = 16 << 20  # 64 MiB held 0.27 GB per rank of a pair (own + peer's regions)

_HEADER_BYTES = 16  # bytes of this chunk, and the size of a region whose fd comes along
_NAME_BYTES = 40  # "rpeg-pair-" + 24 hex digits + padding, sent as a fixed-size uint8 tensor
_TOKEN_BYTES = 16  # the secret the connecting rank sends first (another local process cannot)

# group -> its channel (None: the pair is not on one host, or not a gloo pair); the group is
# held so that its id cannot be reused while cached; close_pair_channels() clears it
_CHANNELS: dict[int, tuple[Any, PairChannel | None]] = {}
_LOCK = threading.Lock()


class PairChannel:
    """One end of the channel to the other rank of a pair: a connected stream socket for
    16-byte headers (and, once per region, its file descriptor) and shared-memory regions
    for the bytes.

    Each rank writes what it sends into its own region (a ``memfd``, handed to the peer over
    the socket with ``SCM_RIGHTS`` when created or grown), sends a header, waits for the
    peer's header and reads the peer's bytes straight out of the peer's region: one copy per
    side and direction, one wake-up, instead of the kernel copying socket buffers in and out
    in ~200 KiB pieces with a wake-up each. Two regions per side, used in turn: a rank
    writes region ``i % 2`` at its exchange ``i`` only after it received the peer's header
    of exchange ``i - 1``, which the peer sent after it finished reading region
    ``(i - 2) % 2`` -- so nothing is overwritten while being read, and no acknowledgement is
    needed. Exchanges larger than :data:`CHUNK_BYTES` go in chunks (bounded regions)."""

    def __init__(self, sock: socket.socket, peer: int, timeout_s: float = PAIR_TIMEOUT_S):
        sock.settimeout(timeout_s)
        self.sock = sock
        self.peer = peer
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._turn = 0
        self._mine: list[SharedRegion | None] = [None, None]  # written here, read by the peer
        self._theirs: list[SharedRegion | None] = [None, None]  # the peer's, read here

    def exchange(self, t: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Send ``t`` (a CPU tensor) and return the other rank's tensor of the same shape and
        dtype (received into ``out``, contiguous, when given)."""
        t = t.contiguous()
        if out is None:
            out = torch.empty_like(t)
        elif not (out.is_contiguous() and out.dtype == t.dtype and out.numel() == t.numel()):
            raise ValueError("exchange: out must be contiguous, of the tensor's dtype and size")
        dst = out.reshape(-1).view(torch.uint8)
        self._swap(t, lambda a, got: dst[a : a + got.numel()].copy_(got))
        return out

    def exchange_sum(self, send: torch.Tensor, addend: torch.Tensor, out: torch.Tensor) -> None:
        """``out = addend + (the peer's send)``, the peer's bytes added straight from its
        region (no copy). ``send``, ``addend`` and ``out`` are contiguous, of one dtype and
        size; ``out`` may be ``addend`` (and ``send``: an in-place sum)."""
        if not (addend.dtype == out.dtype == send.dtype and out.numel() == send.numel()):
            raise ValueError("exchange_sum: send, addend and out must share dtype and size")
        if not (out.is_contiguous() and addend.is_contiguous()):
            raise ValueError("exchange_sum: addend and out must be contiguous")
        size = send.element_size()
        flat_out, flat_add = out.reshape(-1), addend.reshape(-1)

        def add(a: int, got: torch.Tensor) -> None:
            i, n = a // size, got.numel() // size
            torch.add(flat_add[i : i + n], got.view(out.dtype), out=flat_out[i : i + n])

        self._swap(send.contiguous(), add)

    def exchange_sum_(self, ts: list[torch.Tensor], divide: float = 1.0) -> None:
        """Every tensor of ``ts`` += the peer's tensor at the same place of its list, in
        place, then divided by ``divide`` (a pair's mean at 2: ``(own + peer) / 2``,
        bit-identical on both ranks). Contiguous CPU tensors of one dtype, the same sizes in
        the same order on both ranks. They are written one after another into this rank's
        region (the only copy) and the peer's bytes are added straight into them: a bucket of
        gradients summed without flattening it into one tensor and copying the sum back (that
        took ~25 ms of rpeg-tiny's 0.31 s dp=2 train step: docs/measurements.md).

        A power-of-two ``divide`` costs no pass of its own: each rank writes ``own / divide``
        into its region (the copy it makes anyway) and takes ``peer's / divide + own /
        divide`` in one ``torch.add(..., alpha=1 / divide)``. Scaling by a power of two is
        exact, so the result is the correctly rounded ``(own + peer) / divide`` (outside the
        subnormal range), the same bits on both ranks (addition commutes). Any other divisor
        divides after the sum."""
        if not ts:
            return
        _check_pieces(ts, "exchange_sum_")
        flats = [t.view(-1) for t in ts]
        self.sum_pieces_(flats, flats, divide)

    def sum_pieces_(
        self, send: list[torch.Tensor], recv: list[torch.Tensor], divide: float = 1.0
    ) -> None:
        """Every tensor of ``recv`` := (itself + the peer's ``send`` piece at its place) /
        ``divide``, this rank's ``send`` going to the peer's ``recv`` (:meth:`swap_pieces`
        with ``add``); a power-of-two ``divide`` folded into the copy and the add as
        :meth:`exchange_sum_` describes, any other divided after. The whole-list sum
        (``send`` is ``recv``) and a pair's reduce-scatter (each sends the other's half)."""
        folded = divide != 1.0 and math.frexp(divide)[0] == 0.5  # 2, 4, 0.5 ...: exact 1/x
        self.swap_pieces(send, recv, scale=1.0 / divide if folded else 1.0, add=True)
        if divide != 1.0 and not folded and recv:
            torch._foreach_div_(recv, divide)

    def swap_pieces(
        self,
        send: list[torch.Tensor],
        recv: list[torch.Tensor],
        *,
        scale: float = 1.0,
        add: bool = False,
    ) -> None:
        """Send the tensors of ``send`` back to back (each times ``scale``, written straight
        into this rank's region) and take the peer's, in its order, into ``recv``: copied,
        or with ``add`` each ``r = peer's + scale * r`` (one ``torch.add``; the peer's bytes
        are read from its region, never copied). The peer calls it with its own lists: its
        ``send`` holds, in bytes and dtype, what this rank's ``recv`` does, and the two
        directions may differ in size -- a reduce-scatter (each rank sends the other's half
        of a gradient list and sums its own half) and an all-gather of halves are one call
        each. One dtype, contiguous tensors (``send`` and ``recv`` may share tensors:
        :meth:`exchange_sum_`)."""
        both = [*send, *recv]
        if not both:
            return
        _check_pieces(both, "swap_pieces")
        dtype, size = both[0].dtype, both[0].element_size()
        sends, recvs = [t.view(-1) for t in send], [t.view(-1) for t in recv]

        def fill(a: int, b: int, dst: torch.Tensor) -> None:
            for f, i, k, off in _pieces(sends, size, a, b):
                into = dst[off : off + k * size].view(dtype)
                if scale != 1.0:
                    torch.mul(f[i : i + k], scale, out=into)
                else:
                    into.copy_(f[i : i + k])

        def take(a: int, got: torch.Tensor) -> None:
            for f, i, k, off in _pieces(recvs, size, a, a + got.numel()):
                piece, theirs = f[i : i + k], got[off : off + k * size].view(dtype)
                if not add:
                    piece.copy_(theirs)
                elif scale != 1.0:
                    torch.add(theirs, piece, alpha=scale, out=piece)
                else:
                    piece.add_(theirs)

        n_send = sum(t.numel() for t in sends) * size
        self._swap_chunks(n_send, fill, take, sum(t.numel() for t in recvs) * size)

    def _swap(self, t: torch.Tensor, take) -> None:
        """Send ``t``'s bytes; ``take(offset, peer bytes)`` for every chunk received."""
        src = t.reshape(-1).view(torch.uint8)
        self._swap_chunks(src.numel(), lambda a, b, dst: dst.copy_(src[a:b]), take)

    def _swap_chunks(self, n: int, fill, take, n_recv: int | None = None) -> None:
        """Send ``n`` bytes in chunks of at most :data:`CHUNK_BYTES`: ``fill(a, b, region)``
        writes bytes [a, b) into this rank's region, ``take(a, peer bytes)`` gets the peer's
        chunk starting at byte ``a``; the peer sends ``n_recv`` bytes (default ``n``). Both
        sides walk ``max(n, n_recv)`` in the same chunks (a side with fewer bytes sends
        short or empty ones), so each knows every header's size."""
        m = n if n_recv is None else n_recv
        step = max(16, CHUNK_BYTES - CHUNK_BYTES % 16)  # whole elements of any dtype
        with self._lock:
            try:
                for a in range(0, max(n, m), step):
                    b, c = max(a, min(n, a + step)), max(a, min(m, a + step))
                    got = self._swap_chunk_with(
                        b - a, lambda dst, a=a, b=b: fill(a, b, dst), expect=c - a
                    )
                    if got.numel():
                        take(a, got)
            except (BrokenPipeError, ConnectionResetError) as e:
                raise ConnectionError(
                    f"pair channel: rank {self.peer} closed the connection mid-exchange ({e})"
                ) from e
            except TimeoutError as e:
                raise TimeoutError(
                    f"pair channel: rank {self.peer} sent nothing for {self.timeout_s:.0f} s"
                ) from e

    def _swap_chunk_with(self, n: int, fill, expect: int | None = None) -> torch.Tensor:
        """Send ``n`` bytes that ``fill(region bytes)`` writes into this rank's region; the
        peer's ``expect`` bytes (default ``n``; a view of its region) back."""
        expect = n if expect is None else expect
        slot = self._turn % 2
        self._turn += 1
        region = self._mine[slot]
        grown = n > 0 and (region is None or region.size < n)
        if grown:
            old, region = region, SharedRegion.create(max(n, 2 * (region.size if region else 0)))
            self._mine[slot] = region
            if old is not None:
                old.close()  # the peer keeps its own mapping until it adopts the new one
        if n:
            fill(region.bytes[:n])
        head = n.to_bytes(8, "little") + (region.size if grown else 0).to_bytes(8, "little")
        if grown:
            region.send_fd(self.sock, head)
        else:
            self.sock.sendall(head)
        got, size, fds = self._recv_header()
        if got != expect:
            what = f"sent {n}" if expect == n else f"expected {expect}"
            raise ValueError(
                f"pair channel: rank {self.peer} sent {got} bytes where this rank {what} "
                "(both ranks must exchange tensors of one size, in the same order)"
            )
        if size:
            if not fds:
                raise ConnectionError(f"pair channel: rank {self.peer} sent no region")
            old, self._theirs[slot] = self._theirs[slot], SharedRegion.adopt(fds[0], size)
            if old is not None:
                old.close()
        if not expect:
            return _EMPTY
        theirs = self._theirs[slot]
        if theirs is None or theirs.size < expect:
            raise ConnectionError(
                f"pair channel: rank {self.peer} sent no region of {expect} bytes"
            )
        return theirs.bytes[:expect]

    def _recv_header(self) -> tuple[int, int, list[int]]:
        buf, fds = b"", []
        while len(buf) < _HEADER_BYTES:
            part, got_fds, _, _ = socket.recv_fds(self.sock, _HEADER_BYTES - len(buf), 1)
            fds += got_fds
            if not part:
                for fd in fds:
                    os.close(fd)
                raise ConnectionError(
                    f"pair channel: rank {self.peer} closed the connection mid-exchange"
                )
            buf += part
        for fd in fds[1:]:
            os.close(fd)
        return int.from_bytes(buf[:8], "little"), int.from_bytes(buf[8:], "little"), fds[:1]

    def close(self) -> None:
        self.sock.close()
        for regions in (self._mine, self._theirs):
            for i, r in enumerate(regions):
                if r is not None:
                    r.close()
                regions[i] = None


_EMPTY = torch.empty(0, dtype=torch.uint8)


def _check_pieces(ts: list[torch.Tensor], what: str) -> None:
    dtype = ts[0].dtype
    if any(t.dtype != dtype or not t.is_contiguous() for t in ts):
        raise ValueError(f"{what}: tensors must be contiguous and of one dtype")


def _pieces(flats: list[torch.Tensor], size: int, a: int, b: int):
    """(tensor, first element, elements, offset from ``a``) of bytes [a, b) of ``flats``
    laid back to back (``size`` bytes an element)."""
    start = 0
    for f in flats:
        end = start + f.numel() * size
        lo, hi = max(a, start), min(b, end)
        if lo < hi:
            yield f, (lo - start) // size, (hi - lo) // size, lo - a
        if end >= b:
            return
        start = end


def host_key() -> int:
    """This process's host, as a signed 63-bit number: the host name, the kernel's boot id
    and the network namespace (ranks that share all three can reach each other's abstract
    Unix sockets)."""
    parts = [socket.gethostname()]
    for path in ("/proc/sys/kernel/random/boot_id",):
        try:
            with open(path) as f:
                parts.append(f.read().strip())
        except OSError:
            parts.append("")
    try:
        parts.append(str(os.stat("/proc/self/ns/net").st_ino))
    except OSError:
        parts.append("")
    text = "\n".join(parts).encode()
    return (zlib.crc32(text) << 31) ^ zlib.adler32(text)


def pair_channel(group) -> PairChannel | None:
    """The channel of ``group`` (a 2-rank gloo process group whose ranks share a host), opened
    on first use -- a collective: both ranks call it -- or None (other groups, other hosts,
    not Linux)."""
    key = id(group)
    hit = _CHANNELS.get(key)
    if hit is not None:
        return hit[1]
    with _LOCK:
        hit = _CHANNELS.get(key)
        if hit is None:
            hit = (group, _open(group))
            _CHANNELS[key] = hit
    return hit[1]


def close_pair_channels() -> None:
    """Close every channel of this process (before its process groups are destroyed)."""
    with _LOCK:
        for _, ch in _CHANNELS.values():
            if ch is not None:
                ch.close()
        _CHANNELS.clear()


class _FreshBuffers:
    """FSDP2's ``Comm.allocate``: a new tensor per call (its default allocator's choice)."""

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class PairAllGather(_FreshBuffers):
    """FSDP2's all-gather (``FSDPModule.set_custom_all_gather``) over the pair channel of a
    2-rank data-parallel group on one host; any other group: ``all_gather_single``."""

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        import torch.distributed as dist

        ch = pair_channel(group) if input_tensor.device.type == "cpu" else None
        if ch is None:
            return dist.all_gather_single(
                output_tensor, input_tensor, group=group, async_op=async_op
            )
        n = input_tensor.numel()
        me = dist.get_group_rank(group, dist.get_rank())
        out = output_tensor.view(-1)
        ch.exchange(input_tensor, out=out[(1 - me) * n : (2 - me) * n])
        mine = out[me * n : (me + 1) * n]
        if mine.data_ptr() != input_tensor.data_ptr():  # FSDP copies the input into place
            mine.copy_(input_tensor.reshape(-1))
        return None  # done: FSDP waits on no work


class PairReduceScatter(_FreshBuffers):
    """FSDP2's reduce-scatter (``FSDPModule.set_custom_reduce_scatter``) of a sum or mean over
    the pair channel (each rank sends the other's half, adds what it receives to its own);
    other groups and ops: ``reduce_scatter_single``."""

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        import torch.distributed as dist

        ch = pair_channel(group) if input_tensor.device.type == "cpu" else None
        if ch is None or op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            return dist.reduce_scatter_single(
                output=output_tensor, input=input_tensor, group=group, op=op, async_op=async_op
            )
        n = output_tensor.numel()
        me = dist.get_group_rank(group, dist.get_rank())
        flat = input_tensor.reshape(-1)
        ch.exchange_sum(
            flat[(1 - me) * n : (2 - me) * n], flat[me * n : (me + 1) * n], output_tensor
        )
        if op == dist.ReduceOp.AVG:
            output_tensor.div_(2)
        return None


def use_pair_comms(fsdp_module, dp_mesh) -> None:
    """Route ``fsdp_module``'s all-gathers and reduce-scatters over the pair channel when its
    data-parallel mesh is a 2-rank gloo group (the channel itself opens only on one host)."""
    import torch.distributed as dist

    group = dp_mesh.get_group()
    if dp_mesh.device_type != "cpu" or dist.get_world_size(group) != 2:
        return
    if dist.get_backend(group) != "gloo":
        return
    fsdp_module.set_custom_all_gather(PairAllGather())
    fsdp_module.set_custom_reduce_scatter(PairReduceScatter())


def gloo_swap(t: torch.Tensor, group, peer: int) -> torch.Tensor:
    """``t`` sent to group rank ``peer`` and the peer's tensor of the same shape received
    (one gloo ``isend`` / ``recv``)."""
    import torch.distributed as dist

    other = torch.empty_like(t)
    send = dist.isend(t, group=group, group_dst=peer)
    dist.recv(other, group=group, group_src=peer)
    send.wait()
    return other


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            break
        buf += part
    return buf


def _accept_peer(listener: socket.socket, token: bytes) -> socket.socket:
    """The first connection that sends ``token`` (others are closed); ``OSError`` (a
    timeout) if none comes within the listener's timeout."""
    while True:
        conn, _ = listener.accept()
        conn.settimeout(_CONNECT_TIMEOUT_S)
        try:
            if secrets.compare_digest(_recv_exact(conn, len(token)), token):
                return conn
        except OSError:
            pass
        conn.close()


def _open(group) -> PairChannel | None:
    """Agree over ``group`` (gloo) whether both ranks share a host; if so, the lower rank
    listens on a fresh abstract socket name and sends it with a random token over the group,
    the higher connects and sends the token first (the listener serves only that
    connection); both confirm over the group."""
    import torch.distributed as dist

    if dist.get_world_size(group) != 2 or dist.get_backend(group) != "gloo":
        return None
    me = dist.get_group_rank(group, dist.get_rank())
    peer = 1 - me
    able = sys.platform.startswith("linux") and hasattr(os, "memfd_create")  # abstract + memfd
    mine = torch.tensor([host_key(), int(able)], dtype=torch.int64)
    theirs = gloo_swap(mine, group, peer)
    if not (able and bool(theirs[1]) and int(theirs[0]) == int(mine[0])):
        return None
    listener = sock = None
    msg = torch.zeros(_NAME_BYTES + _TOKEN_BYTES, dtype=torch.uint8)
    try:
        if me == 0:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            raw = ("rpeg-pair-" + secrets.token_hex(12)).encode()
            token = secrets.token_bytes(_TOKEN_BYTES)
            listener.bind(b"\0" + raw)
            listener.listen(4)
            listener.settimeout(_CONNECT_TIMEOUT_S)
            msg[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
            msg[_NAME_BYTES:] = torch.frombuffer(bytearray(token), dtype=torch.uint8)
            dist.send(msg, group=group, group_dst=peer)  # over the group: only the peer has it
            sock = _accept_peer(listener, token)
        else:
            dist.recv(msg, group=group, group_src=peer)
            data = bytes(msg.tolist())
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(_CONNECT_TIMEOUT_S)
            sock.connect(b"\0" + data[:_NAME_BYTES].rstrip(b"\0"))
            sock.sendall(data[_NAME_BYTES:])
        ok = 1
    except OSError:
        ok = 0
    finally:
        if listener is not None:
            listener.close()
    both = gloo_swap(torch.tensor([ok], dtype=torch.int64), group, peer)
    if not (ok and int(both[0])):
        if sock is not None:
            sock.close()
        return None
    return PairChannel(sock, peer=dist.get_global_rank(group, peer), timeout_s=_timeout_s(group))


def _timeout_s(group) -> float:
    """The group's collective timeout (its gloo backend's options), else PAIR_TIMEOUT_S."""
    try:
        return float(group._get_backend(torch.device("cpu")).options._timeout.total_seconds())
    except Exception:  # a private attribute: absent in another torch, keep the default
        return PAIR_TIMEOUT_S
