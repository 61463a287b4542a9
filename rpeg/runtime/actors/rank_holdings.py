"""What a rank holds, for the run summary and the layout tests: the bytes of the parameters
of each role on this rank and unsharded (``layout_info``), and its peak memory
(``memory_info``). A part of :class:`rpeg.runtime.actors.rank.RankActor` (``rank.holdings``)
over its models (:class:`rpeg.runtime.actors.rank_models.RankModels`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from rpeg.runtime.actors.memory import peak_rss

if TYPE_CHECKING:
    from rpeg.runtime.actors.rank_models import RankModels


class RankHoldings:
    """What a rank holds (remote)."""

    def __init__(self, models: RankModels) -> None:
        self.models = models

    def layout_info(self) -> dict[str, Any]:
        """This rank's layout and what it holds: ``param_bytes_per_rank`` (bytes of the
        parameters this rank holds, per role) and ``full_param_bytes`` (of the unsharded
        roles), with their totals."""
        m = self.models
        lay = m.layout
        local = m.param_bytes(full=False)
        full = dict(m.full_bytes or m.param_bytes(full=True))
        if "engine" in local and "engine" not in full:  # built after the layout (vLLM): whole
            full["engine"] = local["engine"]
        return {
            "group": m.group.name,
            "rank": m.rank,
            "dp": lay.dp,
            "tp": lay.tp,
            "ep": lay.ep,
            "fsdp": lay.fsdp,
            "dp_index": lay.dp_index(m.rank),
            "tp_index": lay.tp_index(m.rank),
            "device": str(m.device),
            "cpu_cores": list(m.cpu_cores),
            "dtype": lay.dtype,
            "param_bytes_per_rank": {**local, "total": sum(local.values())},
            "full_param_bytes": {**full, "total": sum(full.values())},
        }

    def memory_info(self) -> dict[str, Any]:
        """Peak memory of this rank since the actor started: the process's peak resident set
        (``VmHWM``, reset when the actor is created: a worker process outlives its actors),
        and the CUDA allocator's peak on a GPU rank."""
        device = self.models.device
        out: dict[str, Any] = {"device": str(device), "peak_rss_bytes": peak_rss()}
        if device.type == "cuda":
            out["peak_device_bytes"] = int(torch.cuda.max_memory_allocated(device))
        return out
