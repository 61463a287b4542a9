"""What a rank holds, for the run summary and the layout tests: the bytes of the parameters
of each role on this rank and unsharded (``layout_info``), and its peak memory
(``memory_info``). A mixin of :class:`rpeg.runtime.actors.rank.RankActor`."""

from __future__ import annotations

from typing import Any

import torch

from rpeg.runtime.actors.memory import peak_rss


class RankHoldings:
    """Inspection methods of a rank (remote, but ``_param_bytes``)."""

    def _param_bytes(self, full: bool) -> dict[str, int]:
        from rpeg.runtime.sharding import param_bytes_full, param_bytes_local

        fn = param_bytes_full if full else param_bytes_local
        out = {}
        for name in ("actor", "reference", "critic"):
            wk = getattr(self, name)
            if wk is not None:
                out[name] = fn(wk.module)
        eng = self.actor.engine if self.actor is not None else None
        held = getattr(eng, "model", None)
        if eng is not None and held is None:  # vLLM: its own full copy, in its own process
            out["engine"] = int(getattr(eng, "param_bytes", 0))
        elif eng is not None and held is not self.actor.lm:
            out["engine"] = fn(held)
        return out

    def layout_info(self) -> dict[str, Any]:
        """This rank's layout and what it holds: ``param_bytes_per_rank`` (bytes of the
        parameters this rank holds, per role) and ``full_param_bytes`` (of the unsharded
        roles), with their totals."""
        lay = self.layout
        local = self._param_bytes(full=False)
        full = dict(getattr(self, "_full_bytes", None) or self._param_bytes(full=True))
        if "engine" in local and "engine" not in full:  # built after the layout (vLLM): whole
            full["engine"] = local["engine"]
        return {
            "group": self.group.name,
            "rank": self.rank,
            "dp": lay.dp,
            "tp": lay.tp,
            "ep": lay.ep,
            "fsdp": lay.fsdp,
            "dp_index": lay.dp_index(self.rank),
            "tp_index": lay.tp_index(self.rank),
            "device": str(self.device),
            "cpu_cores": list(self.cpu_cores),
            "dtype": lay.dtype,
            "param_bytes_per_rank": {**local, "total": sum(local.values())},
            "full_param_bytes": {**full, "total": sum(full.values())},
        }

    def memory_info(self) -> dict[str, Any]:
        """Peak memory of this rank since the actor started: the process's peak resident set
        (``VmHWM``, reset when the actor is created: a worker process outlives its actors),
        and the CUDA allocator's peak on a GPU rank."""
        out: dict[str, Any] = {"device": str(self.device), "peak_rss_bytes": peak_rss()}
        if self.device.type == "cuda":
            out["peak_device_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
        return out
