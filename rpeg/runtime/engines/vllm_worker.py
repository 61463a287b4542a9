"""What RPEG mixes into every vLLM worker (``worker_extension_cls``): the receiving end of a
weight update (rpeg.runtime.engines.vllm_transfer has the protocol).

vLLM builds one worker per tensor-parallel rank (in its engine-core process for tp 1, in
processes of their own for tp > 1) with this class as an extra base, so ``self`` is the
worker: ``self.rank`` its tensor-parallel rank, ``self.model_runner`` its runner. The
methods are called by name through ``LLM.collective_rpc`` (no pickled callables) with plain
lists as arguments, and move tensors only through the update group.

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
    """The worker side of :class:`rpeg.runtime.engines.vllm.VLLMEngine`'s weight updates."""

    _rpeg_pg: Any = None

    def rpeg_join_update_group(self, address: str, size: int, timeout_s: float) -> int:
        """Join the update group at ``address`` as rank ``1 + tp rank``; returns it."""
        from rpeg.runtime.engines.vllm_transfer import join_group

        rank = 1 + int(getattr(self, "rank", 0))
        self._rpeg_pg = join_group(address, rank, int(size), float(timeout_s))
        return rank

    def rpeg_receive_weights(self, plan: list[list[Any]]) -> int:
        """Receive every bucket of ``plan`` (wire form of a list of ``BucketPlan``) from the
        owner's broadcasts and reload them in place; returns how many tensors it loaded."""
        from rpeg.runtime.engines.vllm_transfer import BucketPlan, receive_bucket, unpack_bucket

        if self._rpeg_pg is None:
            raise RuntimeError("rpeg_receive_weights before rpeg_join_update_group")
        buckets = [BucketPlan.from_wire(w) for w in plan]
        runner = self.model_runner
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        device = next(model.parameters()).device
        count = received = 0

        def weights():
            nonlocal count, received
            for b in buckets:
                flat = receive_bucket(self._rpeg_pg, b, device)
                received += 1
                for name, t in unpack_bucket(b, flat):
                    count += 1
                    yield name, t

        try:
            with torch.no_grad():
                if hasattr(runner, "reload_weights"):
                    runner.reload_weights(weights_iterator=weights())
                else:  # an older vLLM: the model's own loader (GPU layouts need no re-pack)
                    model.load_weights(weights=weights())
                repack_tied_head(model)
        except BaseException:
            # take every remaining bucket anyway: the owner's broadcasts complete and the
            # group stays usable; the error reaches the owner as this RPC's failure
            for b in buckets[received:]:
                receive_bucket(self._rpeg_pg, b, torch.device("cpu"))
            raise
        return count

    def rpeg_leave_update_group(self) -> bool:
        pg, self._rpeg_pg = self._rpeg_pg, None
        if pg is not None:
            with contextlib.suppress(Exception):  # the owner already gone
                pg.shutdown()
        return True
