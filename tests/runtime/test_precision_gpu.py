"""The CUDA side of issue 26's precision and device paths (skipped without a CUDA device;
the same code runs on the CPU in test_precision.py, test_weight_sync_device.py and
test_device_state.py): a bf16 first step on the GPU against fp32 there, fp32 masters and
AdamW state, weight buckets built on the GPU with no host copy, a model read straight onto
the GPU, and the real CUDA RNG through a role's checkpoint."""

from __future__ import annotations

import pytest
import sharding_cases as C
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]


def _step(over: dict):
    cfg = C.config(**over)
    m, tok = C.model()
    w = C.policy(cfg, m.to("cuda"), tok)
    return w.train_step(C.with_old_logprobs(C.batch(0), w)), w


def test_bf16_step_on_the_gpu_matches_fp32_with_fp32_masters():
    ref, _ = _step({})
    got, w = _step({"workload.precision": "bf16"})
    for k in ("pg_loss", "kl", "entropy"):
        assert got[k] == pytest.approx(ref[k], rel=1e-3), k
    assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-2)
    assert {p.dtype for p in w.module.parameters()} == {torch.float32}
    states = {v.dtype for st in w.optimizer.state.values() for v in st.values() if v.dim()}
    assert states == {torch.float32}


def test_weight_buckets_stay_on_the_gpu(monkeypatch):
    from rpeg.runtime.actors.weight_sync import stream_buckets, unpack_views

    _, w = _step({"workload.precision": "bf16"})
    monkeypatch.setattr(torch.Tensor, "cpu", lambda *a, **k: pytest.fail("host copy"))
    meta, fetch = w.weight_source()
    buckets = list(stream_buckets(meta, fetch, 1 << 20, torch.device("cuda")))
    assert {b.flat.device.type for b in buckets} == {"cuda"}
    got = unpack_views(buckets)
    for k, v in w.lm.state_dict().items():
        assert torch.equal(got[k], v.to(torch.bfloat16)), k


def test_a_model_is_read_straight_onto_the_gpu(tmp_path):
    from rpeg.runtime.model_io import load_model, save_pretrained

    m, tok = C.model()
    save_pretrained(m, tok, str(tmp_path))
    got = load_model(str(tmp_path), device=torch.device("cuda"))
    assert {p.device.type for p in got.parameters()} == {"cuda"}
    for k, v in m.state_dict().items():
        assert torch.equal(got.state_dict()[k].cpu(), v), k


def test_cuda_rng_round_trips_through_a_role_checkpoint():
    _, w = _step({})
    st = w.state_dict()
    a = torch.rand(4, device="cuda")
    w.load_state_dict(st)
    assert torch.equal(torch.rand(4, device="cuda"), a)
