"""Tensor parallelism from the model's own plan (issue 40 item 1) on two gloo ranks: the same
logits and gradients as one process, per-head q/k norms (``replicated_with_grad_allreduce``)
included, MoE experts kept whole."""

from __future__ import annotations

import pytest
import torch

from tests.runtime.models import ranks

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("model_type", "port"), [("qwen3", 29811), ("qwen3_moe", 29813), ("gemma3_text", 29815)]
)
def test_tp2_from_the_models_plan_equals_one_process(model_type, port):
    ref = ranks.reference(model_type)
    out = ranks.spawn(2, "tp_case", port, model_type=model_type, tp=2)
    for r in (0, 1):
        torch.testing.assert_close(out[r]["logits"], ref["logits"], atol=1e-5, rtol=0)
        assert out[r]["grads"].keys() == ref["grads"].keys()
        for n, g in ref["grads"].items():
            torch.testing.assert_close(out[r]["grads"][n], g, atol=1e-5, rtol=1e-4, msg=n)
