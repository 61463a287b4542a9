"""Routing record and replay (rpeg.runtime.model_io.routing, issue 40 item 4's mechanism): a
model whose routers moved routes other tokens than the recorded forward did; replaying the
record makes every router choose the recorded experts (mismatch 0), with the routing weights
still the router's own (its gradient flows)."""

from __future__ import annotations

import pytest
import torch

from tests.runtime.models.tiny_folders import MOE_TYPES, tiny_hf_config

IDS = torch.tensor([[1, 40, 41, 17, 42, 2, 5, 9], [1, 22, 7, 3, 3, 8, 60, 61]])


@pytest.mark.parametrize("model_type", MOE_TYPES)
def test_replay_routes_as_recorded_and_the_router_still_learns(model_type):
    from transformers import AutoModelForCausalLM

    from rpeg.runtime.model_io.routing import (
        RouteRecorder,
        replaying,
        routers,
        routing_mismatch,
    )

    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(tiny_hf_config(model_type))
    rec = RouteRecorder(lm)
    with rec, torch.no_grad():
        rollout_logits = lm(input_ids=IDS).logits
    rollout = rec.routes()
    assert rollout.shape == (2, IDS.numel(), 2)  # 2 MoE layers, 16 tokens, top-2
    with torch.no_grad():  # the trainer's weights moved: the routers now choose otherwise
        for r in routers(lm):
            r.weight.add_(torch.randn_like(r.weight))
    rec.clear()
    with rec:
        lm(input_ids=IDS)
    assert routing_mismatch(rollout, rec.routes()) > 0.2
    rec.clear()
    with rec, replaying(lm, rollout):
        out = lm(input_ids=IDS).logits
    assert routing_mismatch(rollout, rec.routes()) == 0.0
    assert not torch.allclose(out, rollout_logits)  # other router weights, the same experts
    out.logsumexp(-1).sum().backward()
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in routers(lm))
    with torch.no_grad():  # outside the context the routers choose again
        rec.clear()
        with rec:
            lm(input_ids=IDS)
    assert routing_mismatch(rollout, rec.routes()) > 0.2


def test_mismatch_counts_the_kept_tokens_only():
    from rpeg.runtime.model_io.routing import routing_mismatch

    a = torch.tensor([[[0, 1], [2, 3], [1, 2]]])
    b = torch.tensor([[[1, 0], [2, 0], [3, 1]]])  # same set, differs, differs
    assert routing_mismatch(a, b) == pytest.approx(2 / 3)
    assert routing_mismatch(a, b, torch.tensor([1, 0, 0])) == 0.0
    assert routing_mismatch(a, b, torch.tensor([1, 1, 0])) == pytest.approx(0.5)
