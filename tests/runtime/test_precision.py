"""Mixed precision (rpeg.runtime.precision): fp32 master weights and AdamW state, bf16 (or
fp16 with a dynamic loss scale) compute, on every layout. CPU autocast runs bf16 and fp16
matmuls, so all of it runs here.

Tolerances, stated once: bf16 keeps 8 significant bits (relative rounding 2^-9 ~ 0.2% per
operation). On the test model (2 layers, hidden 64) a first step's loss metrics agree with
fp32 within 1e-3 relative and the gradient norm within 1% relative (measured: kl 2.6e-4,
grad norm 6e-4 relative, docs/measurements.md); the 20-step loss curve within 2e-3
absolute (measured 1.5e-4).
"""

from __future__ import annotations

import pytest
import sharding_cases as C
import torch

LOSS_RTOL = 1e-3
NORM_RTOL = 1e-2
LOSSES = ("pg_loss", "kl", "entropy")
BF16 = {"workload.precision": "bf16"}


def _first_step(over: dict | None = None):
    cfg = C.config(**(over or {}))
    m, tok = C.model()
    w = C.policy(cfg, m, tok)
    metrics = w.train_step(C.with_old_logprobs(C.batch(0), w))
    return metrics, w


@pytest.fixture(scope="module")
def fp32_step():
    return _first_step()


@pytest.fixture(scope="module")
def bf16_step():
    return _first_step(BF16)


def _state_dtypes(opt) -> set[torch.dtype]:
    return {v.dtype for st in opt.state.values() for v in st.values() if v.dim()}


def test_one_compute_dtype_rule_for_compiled_groups_and_the_local_trainer():
    from rpeg.compile.layouts import compute_dtype_name

    assert compute_dtype_name("fp32", "cuda") == "float32"
    assert compute_dtype_name("bf16", "cpu") == "bfloat16"
    assert compute_dtype_name("fp16", "cuda") == "float16"
    # auto / fp8: bf16 on a GPU for an fp32 checkpoint, the checkpoint's dtype elsewhere
    assert compute_dtype_name("fp8", "cuda") == "bfloat16"
    assert compute_dtype_name("auto", "cpu", "float32") == "float32"
    assert compute_dtype_name("auto", "cuda", "bfloat16") == "bfloat16"
    with pytest.raises(ValueError, match="model.dtype='int8'"):
        compute_dtype_name("auto", "cpu", "int8")
    # the compiled group's dtype is that rule's answer
    from rpeg.compile import compile_plan

    for prec, want in (("bf16", "bfloat16"), ("fp32", "float32")):
        step = compile_plan(None, C.config(**{"workload.precision": prec}))
        assert {g.dtype for g in step.actor_groups} == {want}


def test_bf16_first_step_matches_fp32(fp32_step, bf16_step):
    ref, _ = fp32_step
    got, _ = bf16_step
    for k in LOSSES:
        assert got[k] == pytest.approx(ref[k], rel=LOSS_RTOL), k
    assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=NORM_RTOL)
    # and bf16 really ran: not bit-identical to fp32
    assert got["grad_norm"] != ref["grad_norm"]


def test_bf16_keeps_fp32_masters_gradients_and_adamw_state(bf16_step):
    _, w = bf16_step
    assert {p.dtype for p in w.module.parameters()} == {torch.float32}
    assert _state_dtypes(w.optimizer) == {torch.float32}
    assert set(w.optimizer.state) == {p for p in w.module.parameters() if p.requires_grad}
    # the forward ran in bf16: a linear's output under the role's compute context
    from rpeg.runtime.precision import compute

    with compute("cpu", w.compute_dtype):
        y = w.lm.model.layers[0].mlp.up_proj(torch.randn(1, 64))
    assert y.dtype == torch.bfloat16
    # weights for a generator go out in the compute dtype
    assert {v.dtype for v in w.get_weights().values()} == {torch.bfloat16}


def test_fp16_trains_with_a_dynamic_loss_scale(fp32_step):
    ref, _ = fp32_step
    got, w = _first_step({"workload.precision": "fp16"})
    assert got["loss_scale"] == 2.0**16
    for k in LOSSES:
        assert got[k] == pytest.approx(ref[k], rel=LOSS_RTOL), k
    assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=NORM_RTOL)
    assert {p.dtype for p in w.module.parameters()} == {torch.float32}
    assert _state_dtypes(w.optimizer) == {torch.float32}
    # an overflowing scale: the update is skipped, the weights untouched, the scale halved
    before = {k: v.clone() for k, v in w.module.state_dict().items()}
    w.loss_scaler.scale = 2.0**120  # fp16's largest finite value is 65504
    m = w.train_step(C.with_old_logprobs(C.batch(1), w))
    assert m["skipped_update_frac"] == 1.0
    assert w.loss_scaler.scale == 2.0**119
    for k, v in w.module.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_loss_scaler_grows_after_an_interval_and_backs_off():
    from rpeg.runtime.precision import LossScaler, loss_scaler_for

    s = LossScaler(scale=8.0, growth_interval=3)
    for _ in range(2):
        s.update(True)
    assert s.scale == 8.0
    s.update(True)
    assert (s.scale, s.good_steps) == (16.0, 0)
    s.update(True)
    s.update(False)
    assert (s.scale, s.good_steps) == (8.0, 0)
    t = LossScaler()
    t.load_state_dict(s.state_dict())
    assert (t.scale, t.good_steps) == (8.0, 0)
    assert loss_scaler_for(torch.bfloat16) is None and loss_scaler_for(torch.float32) is None


def test_unscale_divides_dtensor_and_plain_gradients_and_keeps_inf():
    from rpeg.runtime.precision import unscale_

    a = torch.nn.Parameter(torch.zeros(3))
    b = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    a.grad = torch.tensor([4.0, 8.0, float("inf")])
    b.grad = torch.tensor([2.0, -6.0], dtype=torch.float64)
    unscale_([a, b], 0.5)
    assert a.grad.tolist() == [2.0, 4.0, float("inf")]
    assert b.grad.tolist() == [1.0, -3.0]


def test_roles_hold_masters_and_frozen_copies_in_the_compute_dtype():
    """build_roles at bf16: the trainable actor and critic hold fp32, the reference and a
    lagging generator's copy bf16; every engine decodes under bf16."""
    from rpeg.runtime.role_builder import build_roles

    cfg = C.config(
        **BF16,
        **{
            "algorithm.name": "ppo",
            "optim.warmup_sft_steps": 0,
            "model.tiny_shape": dict(C.SHAPE),
        },
    )
    built = build_roles(cfg, ("actor", "reference", "critic"), engine="torch", lagging_engine=True)

    def dtypes(mod):
        return {p.dtype for p in mod.parameters()}

    assert dtypes(built.actor.lm) == {torch.float32}
    assert dtypes(built.critic.module) == {torch.float32}
    assert dtypes(built.reference.lm) == {torch.bfloat16}
    eng = built.actor.engine
    assert eng.model is not built.actor.lm and dtypes(eng.model) == {torch.bfloat16}
    assert eng.compute_dtype == torch.bfloat16 == built.actor.compute_dtype
    out = built.actor.generate([[1, 5, 9]], built.actor.sampling_params(greedy=True), seed=0)
    assert out.response_ids.shape[0] == 1
    # a weight sync into the lagging copy: bf16 weights, loaded as they are
    eng.update_weights(built.actor.get_weights(), 1)
    a = built.actor.lm.model.embed_tokens.weight.to(torch.bfloat16)
    assert torch.equal(eng.model.model.embed_tokens.weight, a)


def test_fp32_default_changes_nothing(fp32_step):
    """fp32: no autocast, the trainer's fp32 weights go out as they are."""
    _, w = fp32_step
    from rpeg.runtime.precision import compute

    with compute("cpu", w.compute_dtype):
        assert not torch.is_autocast_enabled("cpu")
    full = w.get_weights()
    for k, v in w.lm.state_dict().items():
        assert torch.equal(full[k], v), k


@pytest.mark.slow
def test_fsdp_replicas_and_tp_at_bf16_equal_single_process_bf16(bf16_step):
    """Two gloo ranks: FSDP2 with MixedPrecisionPolicy(bf16, reduce fp32), dp replicas and tp
    -- each a first step like single-process bf16, masters and AdamW state fp32."""
    ref, _ = bf16_step
    layouts = {
        "fsdp": {"dp": 2, "tp": 1, "fsdp": True, "dtype": "bfloat16"},
        "replicas": {"dp": 2, "tp": 1, "fsdp": False, "dtype": "bfloat16"},
        "tp2": {"dp": 1, "tp": 2, "dtype": "bfloat16"},
    }
    cases = [(n, "train", {"layout": lay, "over": BF16}) for n, lay in layouts.items()]
    out = C.spawn(2, cases, port=29751)
    for name, lay in layouts.items():
        res = out[name]
        dp, tp = lay["dp"], lay["tp"]
        for k in LOSSES:
            got = sum(res[d * tp]["metrics"][k] for d in range(dp)) / dp
            assert got == pytest.approx(ref[k], rel=LOSS_RTOL), (name, k)
        for r in res:
            assert res[r]["metrics"]["grad_norm"] == pytest.approx(
                ref["grad_norm"], rel=NORM_RTOL
            ), (name, r)
            assert res[r]["param_dtypes"] == ["torch.float32"], name
            assert res[r]["optim_dtypes"] == ["torch.float32"], name
    pol = out["fsdp"][0]["mp_policies"]
    assert pol and all("param_dtype=torch.bfloat16" in p for p in pol), pol
    assert all("reduce_dtype=torch.float32" in p for p in pol), pol
    assert out["replicas"][0]["mp_policies"] == []


def _curve(over: dict, steps: int) -> list[float]:
    """``steps`` updates on one fixed batch whose old log-probs stay those of the first
    policy: the clipped surrogate falls as the policy moves toward the advantages."""
    cfg = C.config(**over)
    m, tok = C.model()
    w = C.policy(cfg, m, tok)
    b = C.with_old_logprobs(C.batch(0), w)
    return [w.train_step(b)["pg_loss"] for _ in range(steps)]


@pytest.mark.slow
def test_twenty_bf16_steps_track_fp32():
    ref = _curve({}, 20)
    got = _curve(BF16, 20)
    assert ref[-1] < ref[0] - 0.05  # it trains
    for i, (a, b) in enumerate(zip(ref, got, strict=True)):
        assert b == pytest.approx(a, abs=2e-3), i
