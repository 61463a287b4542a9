"""What RPEG mixes into every vLLM worker (``worker_extension_cls``): the receiving end of a
weight update (rpeg.runtime.engines.vllm_transfer has the protocol).

vLLM builds one worker per tensor-parallel rank (in its engine-core process for tp 1, in
processes of their own for tp > 1) with this class as an extra base, so ``self`` is the
worker: ``self.rank`` its tensor-parallel rank, ``self.model_runner`` its runner. The
methods are called by name through ``LLM.collective_rpc`` (no pickled callables) with plain
lists (and, for CUDA IPC, handle bytes) as arguments, and move tensors only through the
update group (gloo or NCCL) or CUDA IPC handles (rpeg.runtime.engines.vllm_cuda_transfer).

An update loads in place through the runner's ``reload_weights(weights_iterator=...)``
(vLLM's in-place reload: it buffers each layer's tensors until the layer is complete, then
loads them through the layer's own loader -- sharding for this rank, fusing q/k/v and
gate/up -- and re-runs the layer's post-load processing, e.g. the CPU build's oneDNN packing
of linear weights). One reload reads every bucket of the update, in order, as it arrives.
A head tied to the embeddings keeps a packed copy of the old embedding on CPU (its layer
loads nothing of its own); it is re-packed after the reload (:func:`repack_tied_head`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def repack_tied_head(model: Any) -> bool:
    """On vLLM's CPU build, re-pack a language-model head that shares its weight with the
    embeddings (the packed copy was made from the old weight). Returns whether it did."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or getattr(head, "weight", None) is not embed.weight:
        return False
    if not hasattr(head, "cpu_linear") or head.weight.device.type != "cpu":
        return False
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(head, remove_weight=False)
    return True


class WeightTransferExtension:
    """The worker side of :class:`rpeg.runtime.engines.vllm.VLLMEngine`'s weight updates.

    ``_rpeg_rebuild``: how a CUDA IPC bucket is opened (None: the real
    :func:`~rpeg.runtime.engines.vllm_cuda_transfer.rebuild_bucket`; tests on CPU set a
    stand-in)."""

    _rpeg_pg: Any = None
    _rpeg_rebuild: Any = None

    def _rpeg_model(self) -> Any:
        runner = self.model_runner
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    def rpeg_device(self) -> list[Any]:
        """This worker's device (wire form of a ``DeviceId``): the transport's choice."""
        from rpeg.runtime.engines.vllm_cuda_transfer import device_id

        return device_id(next(self._rpeg_model().parameters()).device).to_wire()

    def rpeg_join_update_group(self, address: str, size: int, timeout_s: float) -> int:
        """Join the update group at ``address`` as rank ``1 + tp rank``; returns it.
        ``file:`` a gloo group, ``tcp:`` a NCCL one on this worker's GPU."""
        rank = 1 + int(getattr(self, "rank", 0))
        if address.startswith("tcp:"):
            from rpeg.runtime.engines.vllm_cuda_transfer import NcclLink

            device = next(self._rpeg_model().parameters()).device
            self._rpeg_pg = NcclLink(address, rank, int(size), device, float(timeout_s))
        else:
            from rpeg.runtime.engines.vllm_transfer import join_group

            self._rpeg_pg = join_group(address, rank, int(size), float(timeout_s))
        return rank

    def _rpeg_load(self, weights: Any) -> None:
        """Load ``(name, tensor)`` pairs in place (vLLM's ``reload_weights``), then re-pack a
        tied head."""
        runner, model = self.model_runner, self._rpeg_model()
        with torch.no_grad():
            if hasattr(runner, "reload_weights"):
                runner.reload_weights(weights_iterator=weights)
            else:  # an older vLLM: the model's own loader (GPU layouts need no re-pack)
                model.load_weights(weights=weights)
            repack_tied_head(model)

    def rpeg_receive_weights(self, plan: list[list[Any]]) -> int:
        """Receive every bucket of ``plan`` (wire form of a list of ``BucketPlan``) from the
        owner's broadcasts and reload them in place; returns how many tensors it loaded."""
        from rpeg.runtime.engines.vllm_transfer import BucketPlan, receive_bucket, unpack_bucket

        if self._rpeg_pg is None:
            raise RuntimeError("rpeg_receive_weights before rpeg_join_update_group")
        pg = self._rpeg_pg
        buckets = [BucketPlan.from_wire(w) for w in plan]
        device = next(self._rpeg_model().parameters()).device
        count = received = 0

        def receive(b, dev):  # gloo: a process group; NCCL: an NcclLink
            return pg.receive(b, dev) if hasattr(pg, "receive") else receive_bucket(pg, b, dev)

        def weights():
            nonlocal count, received
            for b in buckets:
                flat = receive(b, device)
                received += 1
                for name, t in unpack_bucket(b, flat):
                    count += 1
                    yield name, t

        try:
            self._rpeg_load(weights())
        except BaseException:
            # take every remaining bucket anyway: the owner's broadcasts complete and the
            # group stays usable; the error reaches the owner as this RPC's failure
            for b in buckets[received:]:
                receive(b, device)
            raise
        return count

    def rpeg_receive_ipc(self, buckets: list[list[Any]]) -> int:
        """Open every CUDA IPC bucket (wire form of ``IpcBucket``s) on this worker's GPU and
        reload its tensors in place; returns how many it loaded. The views are dropped
        before returning (the owner frees the buckets after this RPC)."""
        from rpeg.runtime.engines.vllm_cuda_transfer import IpcBucket, rebuild_bucket
        from rpeg.runtime.engines.vllm_transfer import unpack_bucket

        rebuild = self._rpeg_rebuild or rebuild_bucket
        shared = [IpcBucket.from_wire(w) for w in buckets]
        device = next(self._rpeg_model().parameters()).device
        flats = [rebuild(b, device) for b in shared]
        named = [nt for b, f in zip(shared, flats, strict=True) for nt in unpack_bucket(b.plan, f)]
        self._rpeg_load(iter(named))
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # read before the owner frees
        del flats, named
        return sum(len(b.plan.entries) for b in shared)

    def rpeg_leave_update_group(self) -> bool:
        pg, self._rpeg_pg = self._rpeg_pg, None
        if pg is not None:
            with contextlib.suppress(Exception):  # the owner already gone
                pg.shutdown()
        return True
