"""The same-host pair channel (rpeg.runtime.pair_channel): exact bytes both ways, no deadlock
on tensors larger than the socket buffers, gloo when the ranks are not on one host, a clear
error when the other rank goes away. Two spawned gloo ranks per test."""

from __future__ import annotations

import io
import traceback

import pytest
import torch


def _init(rank: int, world: int, port: int, timeout_s: float = 120.0) -> None:
    import datetime

    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def _tensors(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    return [
        torch.randn(3, 5, generator=g),
        torch.randn(4096, 1024, generator=g),  # 16 MiB: past any socket buffer, both ways
        torch.randn(7, generator=g).to(torch.bfloat16),
        torch.arange(11, dtype=torch.int64) * (rank + 1),
        torch.empty(0, 3),
        torch.randn(6, 4, generator=g).t(),  # not contiguous
    ]


def _put(q, rank: int, res: dict) -> None:
    buf = io.BytesIO()
    torch.save(res, buf)  # bytes: shared-memory tensors die with this process
    q.put((rank, buf.getvalue()))


def _exchange_body(rank: int, port: int, q) -> None:
    import torch.distributed as dist

    from rpeg.runtime import pair_channel as pc
    from rpeg.runtime.parallel import pair_exchange

    try:
        _init(rank, 2, port)
        ch = pc.pair_channel(dist.group.WORLD)
        got = [ch.exchange(t) for t in _tensors(rank)] if ch is not None else None
        sums = [t + pair_exchange(t, None) for t in _tensors(rank)[:3]]
        pc.close_pair_channels()
        dist.destroy_process_group()
        _put(q, rank, {"opened": ch is not None, "got": got, "sums": sums})
    except Exception:
        q.put((rank, traceback.format_exc()))


def _fallback_body(rank: int, port: int, q) -> None:
    import torch.distributed as dist

    from rpeg.runtime import pair_channel as pc
    from rpeg.runtime.parallel import pair_exchange

    try:
        _init(rank, 2, port)
        if rank == 1:  # as if on another host
            pc.host_key = lambda: -1
        t = _tensors(rank)[0]
        other = pair_exchange(t, None)
        opened = pc.pair_channel(dist.group.WORLD) is not None
        dist.destroy_process_group()
        _put(q, rank, {"opened": opened, "other": other})
    except Exception:
        q.put((rank, traceback.format_exc()))


def _fsdp_comms_body(rank: int, port: int, q) -> None:
    import torch.distributed as dist

    from rpeg.runtime.pair_channel import PairAllGather, PairReduceScatter

    try:
        _init(rank, 2, port)
        world = dist.group.WORLD
        x = _tensors(rank)[0].reshape(-1)
        ours, gloo = torch.empty(2 * x.numel()), torch.empty(2 * x.numel())
        assert PairAllGather()(ours, x, world) is None
        dist.all_gather_single(gloo, x, group=world)
        res = {"gather": (ours, gloo)}
        for name, op in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG)):
            big = _tensors(rank)[1].reshape(-1)[:1000].clone()
            o, g = torch.empty(500), torch.empty(500)
            PairReduceScatter()(o, big, world, op)
            dist.reduce_scatter_single(g, big.clone(), group=world, op=dist.ReduceOp.SUM)
            res[name] = (o, g / 2 if op == dist.ReduceOp.AVG else g)
        dist.destroy_process_group()
        _put(q, rank, res)
    except Exception:
        q.put((rank, traceback.format_exc()))


def _peer_gone_body(rank: int, port: int, q) -> None:
    import torch.distributed as dist

    from rpeg.runtime import pair_channel as pc

    try:
        _init(rank, 2, port)
        ch = pc.pair_channel(dist.group.WORLD)
        ch.exchange(torch.ones(4))
        if rank == 1:
            ch.close()
            q.put((rank, {"closed": True}))
            return
        try:
            ch.exchange(torch.ones(1 << 20))
            q.put((rank, {"error": None}))
        except ConnectionError as e:
            q.put((rank, {"error": str(e)}))
    except Exception:
        q.put((rank, traceback.format_exc()))


def _silent_peer_body(rank: int, port: int, q) -> None:
    import time

    import torch.distributed as dist

    from rpeg.runtime import pair_channel as pc

    try:
        _init(rank, 2, port, timeout_s=2.0)
        ch = pc.pair_channel(dist.group.WORLD)
        if rank == 1:
            time.sleep(6)  # alive, sends nothing
            q.put((rank, {"slept": True}))
            return
        t0 = time.monotonic()
        try:
            ch.exchange(torch.ones(4))
            q.put((rank, {"error": None}))
        except TimeoutError as e:
            q.put((rank, {"error": str(e), "waited": time.monotonic() - t0, "limit": ch.timeout_s}))
    except Exception:
        q.put((rank, traceback.format_exc()))


def _run(body, port: int) -> dict:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=body, args=(r, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in procs:
            rank, res = q.get(timeout=120)
            if isinstance(res, str):
                raise AssertionError(f"rank {rank} failed:\n{res}")
            out[rank] = (
                torch.load(io.BytesIO(res), weights_only=True) if isinstance(res, bytes) else res
            )
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return out


def test_exchange_moves_exact_bytes_both_ways():
    out = _run(_exchange_body, 29731)
    assert out[0]["opened"] and out[1]["opened"]
    for me, peer in ((0, 1), (1, 0)):
        for got, sent in zip(out[me]["got"], _tensors(peer), strict=True):
            assert got.dtype == sent.dtype and got.shape == sent.shape
            assert torch.equal(got, sent)
    # sums through pair_exchange: the true sum, bit-identical on both ranks
    for a, b, x, y in zip(out[0]["sums"], out[1]["sums"], _tensors(0), _tensors(1), strict=False):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, x + y, rtol=0, atol=0)


def test_fsdp_all_gather_and_reduce_scatter_equal_gloo():
    out = _run(_fsdp_comms_body, 29761)
    for r in (0, 1):
        for name in ("gather", "sum", "avg"):
            ours, gloo = out[r][name]
            torch.testing.assert_close(ours, gloo, rtol=0, atol=1e-6, msg=f"rank {r} {name}")


def test_ranks_on_different_hosts_use_gloo():
    out = _run(_fallback_body, 29741)
    assert not out[0]["opened"] and not out[1]["opened"]
    assert torch.equal(out[0]["other"], _tensors(1)[0])
    assert torch.equal(out[1]["other"], _tensors(0)[0])


def test_peer_gone_is_a_connection_error():
    out = _run(_peer_gone_body, 29751)
    assert out[1] == {"closed": True}
    assert out[0]["error"] is not None and "closed the connection" in out[0]["error"]


@pytest.mark.slow  # > 10 s on 2 cores (docs/architecture.md "Tests")
def test_silent_peer_times_out_at_the_groups_timeout():
    out = _run(_silent_peer_body, 29771)
    assert out[0]["limit"] == 2.0  # read from the process group, not the module default
    assert "sent nothing for 2 s" in out[0]["error"]
    assert 1.5 < out[0]["waited"] < 5.5


def test_listener_takes_only_the_connection_that_sends_the_token():
    """Another local process that finds the abstract name first is closed, not served."""
    import secrets
    import socket

    from rpeg.runtime.pair_channel import _accept_peer

    name = b"\0rpeg-pair-test-" + secrets.token_hex(6).encode()
    token = secrets.token_bytes(16)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(name)
    listener.listen(4)
    listener.settimeout(5)
    stranger, peer = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    try:
        stranger.connect(name)
        stranger.sendall(b"x" * 16)
        peer.connect(name)
        peer.sendall(token)
        conn = _accept_peer(listener, token)
        conn.sendall(b"hello")
        assert peer.recv(5) == b"hello"
        stranger.settimeout(5)
        assert stranger.recv(5) == b""  # closed by the listener
        conn.close()
    finally:
        for s in (listener, stranger, peer):
            s.close()


def _channel_pair():
    import socket

    from rpeg.runtime.pair_channel import PairChannel

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return PairChannel(a, peer=1, timeout_s=20), PairChannel(b, peer=0, timeout_s=20)


def _both(fa, fb):
    """Run ``fa`` and ``fb`` at once (the two ends of an exchange); their results or errors."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        ja, jb = pool.submit(fa), pool.submit(fb)
        return [j.exception() or j.result() for j in (ja, jb)]


def _region_fds() -> int:
    """Open descriptors of this process on pair-channel regions (mmaps hold one each)."""
    import contextlib
    import os

    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:rpeg-pair")
    return n


def test_shared_memory_regions_grow_and_chunk(monkeypatch):
    """Chunks of CHUNK_BYTES through two alternating regions that grow on demand (fds passed
    over the socket): exact bytes for every size and dtype in any order of sizes, and sums
    added straight from the peer's region."""
    from rpeg.runtime import pair_channel as pc

    monkeypatch.setattr(pc, "CHUNK_BYTES", 1001)  # cut to whole elements: 992-byte chunks
    assert _region_fds() == 0
    ca, cb = _channel_pair()
    g = torch.Generator().manual_seed(0)
    sizes = [10, 1000, 3, 5000, 251, 5000, 1]  # over, under and at the chunk; regions regrow
    try:
        for n in sizes:
            for dtype in (torch.float32, torch.bfloat16, torch.int64):
                x = (torch.randn(n, generator=g) * 100).to(dtype)
                y = (torch.randn(n, generator=g) * 100).to(dtype)
                gx, gy = _both(lambda x=x: ca.exchange(x), lambda y=y: cb.exchange(y))
                assert torch.equal(gx, y) and torch.equal(gy, x)
            x, y = torch.randn(n, generator=g), torch.randn(n, generator=g)
            sx, sy = x.clone(), y.clone()
            _both(
                lambda sx=sx: ca.exchange_sum(sx, sx, sx),
                lambda sy=sy: cb.exchange_sum(sy, sy, sy),
            )
            assert torch.equal(sx, sy) and torch.equal(sx, x + y)
            out = torch.zeros(n)  # send one tensor, add to another, into a third
            _both(
                lambda x=x, y=y, out=out: ca.exchange_sum(x, y, out),
                lambda x=x, y=y: cb.exchange_sum(y, x, y.clone()),
            )
            assert torch.equal(out, y + y)
            assert _region_fds() <= 8  # 2 regions per end and direction; replaced ones freed
    finally:
        ca.close()
        cb.close()
    assert _region_fds() == 0


def test_a_list_of_tensors_is_summed_in_place_across_chunks(monkeypatch):
    """``exchange_sum_``: each tensor of a list += the peer's tensor at its place, the list
    written back to back into the region and cut into chunks anywhere (inside a tensor, at a
    boundary): every element equals the two ranks' sum, bit-identical on both, for any mix
    of sizes; a list mixing dtypes or holding a non-contiguous tensor is refused."""
    from rpeg.runtime import pair_channel as pc

    monkeypatch.setattr(pc, "CHUNK_BYTES", 1001)  # 992-byte chunks: 248 floats
    ca, cb = _channel_pair()
    g = torch.Generator().manual_seed(1)
    try:
        for shapes in ([(3, 5), (1000,), (7,), (248,), (2, 124), (1,)], [(5000,)], [(0,), (4,)]):
            xs = [torch.randn(s, generator=g) for s in shapes]
            ys = [torch.randn(s, generator=g) for s in shapes]
            want = [x + y for x, y in zip(xs, ys, strict=True)]
            ax, by = [x.clone() for x in xs], [y.clone() for y in ys]
            _both(lambda ax=ax: ca.exchange_sum_(ax), lambda by=by: cb.exchange_sum_(by))
            for a, b, w in zip(ax, by, want, strict=True):
                assert torch.equal(a, w) and torch.equal(b, w)
            _both(  # the pair's mean: (own + peer) / 2, the same bits on both
                lambda ax=ax: ca.exchange_sum_(ax, divide=2.0),
                lambda by=by: cb.exchange_sum_(by, divide=2.0),
            )
            for a, b, w in zip(ax, by, want, strict=True):
                assert torch.equal(a, b) and torch.equal(a, (w + w) / 2)
            for d in (2.0, 4.0, 3.0):  # a power of two folded into the copy and the add; 3 after
                ax, by = [x.clone() for x in xs], [y.clone() for y in ys]
                _both(
                    lambda ax=ax, d=d: ca.exchange_sum_(ax, divide=d),
                    lambda by=by, d=d: cb.exchange_sum_(by, divide=d),
                )
                for a, b, x, y in zip(ax, by, xs, ys, strict=True):
                    assert torch.equal(a, b) and torch.equal(a, (x + y) / d)
        bad = [torch.ones(3), torch.ones(3, dtype=torch.float64)]
        with pytest.raises(ValueError, match="one dtype"):
            ca.exchange_sum_(bad)
        with pytest.raises(ValueError, match="contiguous"):
            ca.exchange_sum_([torch.ones(3, 4).t()])
    finally:
        ca.close()
        cb.close()


def test_exchanges_of_different_sizes_are_an_error_on_both_ranks():
    ca, cb = _channel_pair()
    try:
        ea, eb = _both(lambda: ca.exchange(torch.ones(4)), lambda: cb.exchange(torch.ones(5)))
        assert isinstance(ea, ValueError) and "sent 20 bytes where this rank sent 16" in str(ea)
        assert isinstance(eb, ValueError) and "sent 16 bytes where this rank sent 20" in str(eb)
    finally:
        ca.close()
        cb.close()


def test_pieces_of_unequal_sizes_swap_each_way(monkeypatch):
    """``swap_pieces``: each side sends its list and takes the peer's into another list of
    the peer's size (a reduce-scatter's or all-gather's halves: the directions differ when
    the elements are odd), copied or added at a scale, across chunks and empty sides; a
    receive list of the wrong size is an error naming both sizes."""
    from rpeg.runtime import pair_channel as pc

    monkeypatch.setattr(pc, "CHUNK_BYTES", 1001)  # 992-byte chunks: 248 floats
    ca, cb = _channel_pair()
    g = torch.Generator().manual_seed(2)
    try:
        for na, nb in ((300, 700), (1000, 3), (0, 5), (5, 0), (248, 249)):
            xa = [torch.randn(k, generator=g) for k in (na // 3, na - na // 3)]
            xb = [torch.randn(nb, generator=g)]
            ra = [torch.zeros(nb // 2), torch.zeros(nb - nb // 2)]  # a's receive: b's size
            rb = [torch.zeros(na)]
            _both(
                lambda xa=xa, ra=ra: ca.swap_pieces(xa, ra),
                lambda xb=xb, rb=rb: cb.swap_pieces(xb, rb),
            )
            assert torch.equal(torch.cat(ra), torch.cat(xb))
            assert torch.equal(torch.cat(rb), torch.cat(xa))
            # added at a scale: r = peer's (sent times 1/2) + r / 2
            base_a, base_b = torch.randn(nb, generator=g), torch.randn(na, generator=g)
            sa, sb = [base_a.clone()], [base_b.clone()]
            _both(
                lambda xa=xa, sa=sa: ca.swap_pieces(xa, sa, scale=0.5, add=True),
                lambda xb=xb, sb=sb: cb.swap_pieces(xb, sb, scale=0.5, add=True),
            )
            assert torch.equal(sa[0], torch.cat(xb) * 0.5 + base_a * 0.5)
            assert torch.equal(sb[0], torch.cat(xa) * 0.5 + base_b * 0.5)
        ea, eb = _both(
            lambda: ca.swap_pieces([torch.ones(4)], [torch.zeros(3)]),
            lambda: cb.swap_pieces([torch.ones(4)], [torch.zeros(4)]),
        )
        assert isinstance(ea, ValueError) and "sent 16 bytes where this rank expected 12" in str(ea)
    finally:
        ca.close()
        cb.close()
