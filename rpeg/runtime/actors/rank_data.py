"""A rank's batch store and data plane: the rows of each step it holds, the rows other ranks
fetch from it (``rows``, served asynchronously while the rank computes) and the rows it
fetches itself (``pull``: actor to actor, never through the driver), and the chunks of a
streaming rollout. A part of :class:`rpeg.runtime.actors.rank.RankActor` (``rank.batches``)."""

from __future__ import annotations

import time
from typing import Any


class RankBatches:
    """A rank's rows: ``store`` (step, or a chunk's key -> its batch), the rows pulled for a
    self-reshard until ``commit`` (``incoming``), the chunks of a streaming rollout and the
    tensor bytes received from other actors."""

    def __init__(self) -> None:
        self.store: dict[Any, Any] = {}
        self.incoming: dict[int, Any] = {}  # pulled rows waiting for ``commit`` (self-reshard)
        self.received_bytes = 0  # tensor bytes pulled from other actors (data plane)
        self._chunks: dict[int, list[Any]] = {}  # streamed chunks of a step (producer side)
        self._chunks_done: set[int] = set()

    # ---------------------------------------------------------------- streaming (local)
    def offer_chunk(self, step: int, batch: Any) -> None:
        """A streaming unit's next chunk of ``step``, for a consumer's :meth:`chunk`."""
        self._chunks.setdefault(step, []).append(batch)

    def end_chunks(self, step: int) -> None:
        """Every chunk of ``step`` offered (:meth:`chunk` answers None after the last)."""
        self._chunks_done.add(step)

    # ---------------------------------------------------------------- remote
    def put_batch(self, step: int, batch: Any) -> int:
        self.store[step] = batch
        return int(batch.size)

    def get_batch(self, step: int, pop: bool = False) -> Any:
        return self.store.pop(step) if pop else self.store[step]

    def drop(self, step: int) -> None:
        self.store.pop(step, None)
        self._chunks.pop(step, None)
        self._chunks_done.discard(step)

    async def chunk(self, step: int, i: int, timeout_s: float = 600.0) -> Any:
        """Chunk ``i`` of a streaming unit's rows of ``step`` as soon as it exists (None after
        the last one). Async: answered while this rank's actor thread still generates."""
        import asyncio

        deadline = time.monotonic() + timeout_s
        while True:
            got = self._chunks.get(step, [])
            if i < len(got):
                return got[i]
            if step in self._chunks_done:
                return None
            if time.monotonic() > deadline:
                raise TimeoutError(f"chunk {i} of step {step} not produced in {timeout_s} s")
            await asyncio.sleep(0.002)

    async def rows(self, step: int, start: int, end: int, fields: list[str] | None = None) -> Any:
        """Rows ``[start, end)`` of this rank's batch of ``step`` (trimmed to their lengths);
        only ``fields`` (a dict of tensors) when given. Async: served on the worker's event
        loop, also while this rank's actor thread computes."""
        b = self.store[step]
        sel = b.select(list(range(start, end))) if (start, end) != (0, b.size) else b
        if fields is None:
            return sel
        return {f: getattr(sel, f) for f in fields if getattr(sel, f) is not None}

    async def pull(
        self,
        step: int,
        sources: list[tuple[Any, int, int]],
        fields: list[str] | None = None,
        stage: bool = False,
    ) -> int:
        """Fetch rows from the producing actors (``(actor, start, end)`` each) directly, not
        through the driver. ``fields`` None: the rows become this rank's batch of ``step``;
        else those fields join it. ``stage``: keep them aside until :meth:`commit` (a group
        resharding its own batch). Returns the tensor bytes received."""
        import asyncio

        from rpeg.runtime.actors.dataplane import concat_rows, merge_fields, tensor_bytes

        got = await asyncio.gather(*[a.rows(step, s, e, fields) for a, s, e in sources])
        nbytes = sum(tensor_bytes(g) for g in got)
        self.received_bytes += nbytes
        if fields is None:
            new = concat_rows(got) if got else None
        else:
            new = merge_fields(self.store[step], got)
        if stage:
            self.incoming[step] = new
        else:
            self.store[step] = new
        return nbytes

    def commit(self, step: int) -> int:
        self.store[step] = self.incoming.pop(step)
        return int(self.store[step].size)

    def received(self) -> int:
        return int(self.received_bytes)
