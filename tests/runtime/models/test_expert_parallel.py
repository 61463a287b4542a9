"""Expert parallelism (issue 40 item 3, the mechanism: rpeg.runtime.expert_parallel): the
experts of a tiny MoE split over two gloo ranks, each rank running half the batch, give the
one-process logits and gradients (1e-5)."""

from __future__ import annotations

import pytest
import torch

from tests.runtime.models import ranks

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("model_type", "port"), [("qwen3_moe", 29831), ("mixtral", 29833), ("gpt_oss", 29835)]
)
def test_ep2_equals_one_process(model_type, port):
    ref = ranks.ep_reference(model_type)
    out = ranks.spawn(2, "ep_case", port, model_type=model_type)
    experts = ranks.model(model_type).config.num_local_experts if model_type != "qwen3_moe" else 4
    split = []
    for r in (0, 1):
        torch.testing.assert_close(out[r]["logits"], ref["logits"][r : r + 1], atol=1e-5, rtol=0)
    for n, g in ref["grads"].items():
        if out[0]["grads"][n].shape[:1] != g.shape[:1] and g.shape[0] == experts:
            got = torch.cat([out[0]["grads"][n], out[1]["grads"][n]])  # each rank's experts
            split.append(n)
        else:
            got = out[0]["grads"][n]
            torch.testing.assert_close(out[1]["grads"][n], got, atol=0, rtol=0, msg=n)
        torch.testing.assert_close(got, g, atol=1e-5, rtol=1e-4, msg=n)
    assert len(split) >= 4  # 2 MoE layers x (gate_up, down): every rank held half the experts
