"""Typed calls into the actors of one group.

:class:`RankGroup` holds the Dask actor handles of one group's ranks (``RankActor``); each
method issues one typed call to every rank before waiting on any (a collective needs every
rank inside it), and returns the ranks' results in rank order. A caller writes
``group.state_bytes()``, never a method name as a string. Calls that span several groups (the
weight-sync group's rendezvous and broadcast) are functions over groups here, issued to every
rank of every group before any is awaited.

The data methods (``put_batch``, ``get_batch``, ``pull``, ``commit``, ``drop``) report the
tensor bytes of what they send and receive to the group's ``count_bytes(step, nbytes)``:
what passes through the flow process (``driver_bytes_per_step`` of the run summary).

A handle whose worker is gone raises ``RuntimeError("Worker holding Actor was lost ...")``
when a method is looked up (distributed gives it no type of its own); the proxy turns that
one into :class:`rpeg.runtime.actors.failures.ActorLost` so that the failure is classified by
type from here on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rpeg.runtime.actors.failures import ActorLost
from rpeg.runtime.actors.unit_call import UnitCall

_LOST = "Worker holding Actor was lost"

#: ``count_bytes(step, nbytes)``: tensor bytes of a step through the flow process
ByteCounter = Callable[[int, int], None]


@contextlib.contextmanager
def _classified(name: str) -> Iterator[None]:
    """A lost worker's RuntimeError as :class:`ActorLost` (by type from here on)."""
    try:
        yield
    except RuntimeError as exc:
        if str(exc).startswith(_LOST):
            raise ActorLost(f"group {name}: {exc}") from exc
        raise


#: after one rank's call failed, how long the others get to report theirs (a rank blocked
#: in a collective with a dead peer fails within the transport's timeout, or never)
PEER_ERRORS_WAIT_S = 15.0


def collect(futs: Sequence[Any], timeout_s: float | None = None) -> list[Any]:
    """Every future's result, in order. When one fails, the others get
    :data:`PEER_ERRORS_WAIT_S` to fail too and the error that says why is raised
    (:func:`rpeg.runtime.actors.failures.first_cause`: a lost worker before a bug before a
    collective broken by a lost peer) -- not simply rank 0's, which is often the survivor
    whose all-reduce broke when rank 1's process died."""
    import time

    from rpeg.runtime.actors.failures import first_cause

    out: list[Any] = []
    for i, f in enumerate(futs):
        try:
            until = None if timeout_s is None else time.monotonic() + timeout_s  # per future
            out.append(_result_watching(f, futs[i + 1 :], until))
        except Exception as exc:
            errors = [exc]
            deadline = time.monotonic() + PEER_ERRORS_WAIT_S
            for g in futs[i + 1 :]:
                try:
                    g.result(timeout=max(0.1, deadline - time.monotonic()))
                except TimeoutError:
                    pass  # still running (blocked in the collective): says nothing
                except Exception as other:  # noqa: BLE001 - a peer's error, compared below
                    errors.append(other)
            raise first_cause(errors)  # noqa: B904 - rank i's own error is its context
    return out


#: while waiting for one rank, how often the later ranks are looked at for an error
WATCH_S = 0.5
#: How long reading a finished actor call's outcome may take: it is there already, but Dask
#: hands it over through the client's event loop, which a loaded machine (or a profiler) can
#: stall for seconds; a second was too short (a finished call read as a timed-out one).
DONE_RESULT_S = 60.0


def _result_watching(f: Any, others: Sequence[Any], deadline: float | None) -> Any:
    """``f``'s result; while it runs, a later rank that already failed is raised at once: a
    rank blocked in a collective with a peer that ran out of memory (or raised anything)
    returns only at the collective's timeout (``runtime.collective_timeout_s``, 30 min or
    more), which the run would otherwise wait out before reporting the peer's error."""
    import time

    while True:
        left = None if deadline is None else deadline - time.monotonic()
        try:
            return f.result(timeout=WATCH_S if left is None else max(0.001, min(WATCH_S, left)))
        except TimeoutError:
            if f.done():  # finished while the wait timed out: its own outcome, not a timeout
                return f.result(timeout=DONE_RESULT_S)
            if left is not None and left <= WATCH_S:
                raise  # the caller's timeout passed
        for g in others:
            if g.done():
                g.result(timeout=DONE_RESULT_S)  # its error, raised here; a result: keep waiting


class RankGroup:
    """The ranks of one actor group (``handles[r]`` = rank r's actor)."""

    def __init__(
        self,
        client: Any,
        name: str,
        handles: Sequence[Any],
        count_bytes: ByteCounter | None = None,
    ):
        self.client = client
        self.name = name
        self.handles = list(handles)
        self.count_bytes = count_bytes

    def __len__(self) -> int:
        return len(self.handles)

    # ---------------------------------------------------------------- plumbing
    def _all(
        self,
        call: Callable[[int, Any], Any],
        *,
        ranks: Sequence[int] | None = None,
        step: int | None = None,
        sent: Any = (),
        timeout_s: float | None = None,
    ) -> list[Any]:
        """``call(rank, handle)`` -> an actor future, for every rank (or ``ranks``); then
        every result. With ``step``: the tensor bytes of ``sent`` and of the results are
        counted against it (``count_bytes``)."""
        which = range(len(self.handles)) if ranks is None else ranks
        with self.client.as_current(), _classified(self.name):
            futs = [call(r, self.handles[r]) for r in which]
            out = collect(futs, timeout_s)
        if step is not None and self.count_bytes is not None:
            from rpeg.runtime.actors.dataplane import tensor_bytes

            nbytes = tensor_bytes(sent) + tensor_bytes(out)
            if nbytes:
                self.count_bytes(step, nbytes)
        return out

    def _first(self, call: Callable[[Any], Any]) -> Any:
        return self._all(lambda r, a: call(a), ranks=[0])[0]

    # ---------------------------------------------------------------- lifecycle
    def ping(self) -> list[dict[str, Any]]:
        return self._all(lambda r, a: a.ping())

    def join_process_group(self) -> None:
        """Rank 0 opens the rendezvous; every rank joins (all issued before waiting)."""
        if len(self.handles) <= 1:
            return
        addr = self._first(lambda a: a.rendezvous())
        self._all(lambda r, a: a.init_process_group(addr))

    def close(self, timeout_s: float = 30.0) -> None:
        """Each rank on its own: a dead rank does not keep the live ones from closing."""
        with self.client.as_current():
            pending = []
            for a in self.handles:
                with contextlib.suppress(Exception):
                    pending.append(a.close())
            for p in pending:
                with contextlib.suppress(Exception):
                    p.result(timeout=timeout_s)

    # ---------------------------------------------------------------- data
    def put_batch(self, step: int, batches: Sequence[Any]) -> list[int]:
        """Rank r stores ``batches[r]`` as its rows of ``step`` (they pass the flow process)."""
        return self._all(lambda r, a: a.put_batch(step, batches[r]), step=step, sent=batches)

    def get_batch(self, step: int, ranks: Sequence[int] | None = None) -> list[Any]:
        """The rows of ``step`` held by every rank (or ``ranks``), fetched into this process."""
        return self._all(lambda r, a: a.get_batch(step), ranks=ranks, step=step)

    def pull(self, step: int, per_rank: Sequence[tuple[Any, ...]]) -> list[int]:
        """Rank r fetches its rows from the producers itself: ``per_rank[r]`` = (slices,
        fields, stage) of ``RankActor.pull``. Returns the bytes each rank moved."""
        return self._all(lambda r, a: a.pull(step, *per_rank[r]), step=step)

    def commit(self, step: int) -> list[int]:
        """After a self-reshard's pulls: every rank's pulled rows become its rows of ``step``."""
        return self._all(lambda r, a: a.commit(step), step=step)

    def drop(self, step: int) -> None:
        self._all(lambda r, a: a.drop(step), step=step)

    def run_unit(self, step: int, calls: Sequence[UnitCall]) -> list[Any]:
        """Every rank runs the unit (``calls[r]``: rank r's :class:`UnitCall`)."""
        return self._all(lambda r, a: a.run_unit(step, calls[r]))

    def run_units(self, step: int, per_rank: Sequence[Sequence[UnitCall]]) -> list[list[Any]]:
        """Every rank runs a chain of units (rpeg.runtime.actors.unit_chains) back to back in
        one call; ``per_rank[r]``: rank r's calls in order. Per rank, the results in order."""
        return self._all(lambda r, a: a.run_units(step, list(per_rank[r])))

    # ---------------------------------------------------------------- state
    def state_bytes(self, light: bool = False) -> list[bytes]:
        return self._all(lambda r, a: a.state_bytes(light))

    def save_shards(self, url: str) -> list[str]:
        """Every rank writes its shards to ``url`` (torch.distributed.checkpoint; collective)."""
        return self._all(lambda r, a: a.save_shards(url))

    def load_shards(self, url: str) -> list[int]:
        return self._all(lambda r, a: a.load_shards(url))

    def load_state_bytes(self, parts: Sequence[bytes]) -> None:
        self._all(lambda r, a: a.load_state_bytes(parts[r]))

    def rank_info(self, timeout_s: float | None = None) -> list[tuple[Any, Any]]:
        """(layout_info, memory_info) of every rank."""
        lay = self._all(lambda r, a: a.layout_info(), timeout_s=timeout_s)
        mem = self._all(lambda r, a: a.memory_info(), timeout_s=timeout_s)
        return list(zip(lay, mem, strict=True))

    def memory_info(self) -> list[dict[str, Any]]:
        return self._all(lambda r, a: a.memory_info())

    def evaluate(self) -> dict[str, float]:
        """Validation metrics (rank 0's; rpeg.runtime.validation). Every rank is called: a
        sharded (fsdp/tp) model's forward is a collective, rank 0 alone would wait for its
        peers forever."""
        return dict(self._all(lambda r, a: a.evaluate())[0])

    def param_checksums(self) -> list[float]:
        """Sum of the actor's weights on every rank (a collective when sharded)."""
        return self._all(lambda r, a: a.param_checksum())


# -------------------------------------------------------------------- weight sync (groups)
def join_sync_group(source: RankGroup, targets: Sequence[RankGroup]) -> None:
    """The weight-sync process group: ``source``'s rank 0 (sync rank 0) and every rank of
    the ``targets``, joined all before waiting."""
    members = [a for g in targets for a in g.handles]
    addr = source._first(lambda a: a.sync_rendezvous())
    size = 1 + len(members)
    src = source.handles[0]
    with source.client.as_current(), _classified(source.name):
        pending = [src.join_sync_group(addr, 0, size)]
        pending += [a.join_sync_group(addr, i + 1, size) for i, a in enumerate(members)]
        collect(pending)


def broadcast_weights(
    source: RankGroup, targets: Sequence[RankGroup], bucket_bytes: int
) -> tuple[list[dict[str, float]], list[int]]:
    """Every ``source`` rank gathers the full weights (rank 0 broadcasts them in buckets),
    every ``targets`` rank receives them; all issued before any is awaited. Returns the
    senders' results (rank order) and the versions the receivers loaded."""
    with source.client.as_current(), _classified(source.name):
        send = [a.send_weights(bucket_bytes) for a in source.handles]
        recv = [a.recv_weights(bucket_bytes) for g in targets for a in g.handles]
        done = collect([*send, *recv])
        return done[: len(send)], done[len(send) :]
