"""Which generation engine a run gets (rpeg.runtime.engines.choice): the declared engine from
the config and the plan, resolution by device and availability, the checks before start, the
rank's engine, the torch engine's private copy, install-command messages."""

from __future__ import annotations

import pytest
import torch

from rpeg.config import RunConfig
from rpeg.errors import ConfigError
from rpeg.runtime.engines.choice import (
    check_engine,
    declared_engine,
    logprob_problems,
    resolve_engine,
)
from rpeg.runtime.model_io import create_tiny

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)


@pytest.fixture(scope="module")
def tiny():
    model, tok = create_tiny(seed=0, num_key_value_heads=2, **SMALL)
    return model, tok


# --------------------------------------------------------------------------- the choice
def test_declared_engine_from_config_and_plan():
    assert declared_engine("auto", {"generate": "auto"}) == "auto"
    assert declared_engine("auto", {"rollout": "vllm"}) == "vllm"
    assert declared_engine("torch", {"generate": "auto"}) == "torch"
    assert declared_engine("vllm", {"generate": "vllm"}) == "vllm"
    with pytest.raises(ConfigError) as e:
        declared_engine("torch", {"generate": "vllm", "gen2": "sglang"})
    msgs = [str(p) for p in e.value.problems]
    assert any("plan.units.gen2.engine" in m and "sglang" in m for m in msgs)
    assert any("disagree" in m and "plan.units.generate.engine=vllm" in m for m in msgs)


@pytest.mark.parametrize(
    "declared,device,avail,tp,want",
    [
        ("auto", "cpu", True, 1, "torch"),
        ("auto", "cuda", False, 1, "torch"),
        ("auto", "cuda", True, 1, "vllm"),
        ("auto", "cuda", True, 2, "torch"),
        ("torch", "cuda", True, 1, "torch"),
        ("vllm", "cuda", True, 1, "vllm"),
        ("vllm", "cpu", True, 1, "vllm"),  # vLLM's CPU build installed
    ],
)
def test_resolve_engine(declared, device, avail, tp, want):
    got = resolve_engine(declared, device_type=device, gen_tp=tp, vllm_available=avail)
    assert got == want


def test_explicit_vllm_without_the_package_names_the_install_command():
    with pytest.raises(ConfigError) as e:
        resolve_engine("vllm", device_type="cpu", gen_tp=2, vllm_available=False)
    msgs = [str(p) for p in e.value.problems]
    assert len(msgs) == 2 and all(p.where == "runtime.engine" for p in e.value.problems)
    assert "not installed" in msgs[0] and "bash scripts/vllm_env.sh DIR" in msgs[0]
    assert "tp=2" in msgs[1]
    with pytest.raises(ConfigError, match=r"pip install 'rpeg\[gpu\]'"):
        resolve_engine("vllm", device_type="cuda", vllm_available=False)


def test_untested_vllm_versions_are_named_in_a_warning():
    from rpeg.runtime.engines.choice import vllm_version_warning

    assert vllm_version_warning("0.32.0") is None
    assert vllm_version_warning("0.32.1+cpu") is None
    w = vllm_version_warning("0.30.2")
    assert w is not None and "0.30.2" in w and "0.32.x" in w


def test_check_engine_before_start(monkeypatch):
    from rpeg.compile import compile_plan
    from rpeg.runtime.engines import choice

    monkeypatch.setattr(choice, "vllm_importable", lambda: False)
    cfg = RunConfig()
    assert check_engine(cfg, compile_plan(None, cfg)) == "torch"  # the CPU default
    cfg = RunConfig().with_overrides({"runtime.engine": "vllm"})
    with pytest.raises(ConfigError, match="runtime.engine"):
        check_engine(cfg, compile_plan(None, cfg))
    monkeypatch.setattr(choice, "vllm_importable", lambda: True)  # vLLM's CPU build
    assert check_engine(cfg, compile_plan(None, cfg)) == "vllm"
    with pytest.raises(ConfigError, match="runtime.engine: got 'sglang'"):
        RunConfig().with_overrides({"runtime.engine": "sglang"})


def test_truncated_sampling_with_vllm_needs_recomputed_logprobs():
    cfg = RunConfig()
    w = cfg.workload
    a = cfg.algorithm
    assert logprob_problems("vllm", w, a) == []  # top_k 0, top_p 1: exact
    w2 = w.model_copy(update={"top_p": 0.9})
    (p,) = logprob_problems("vllm", w2, a)
    assert p.where == "algorithm.recompute_old_logprobs"
    assert logprob_problems("torch", w2, a) == []
    assert logprob_problems("vllm", w2, a.model_copy(update={"recompute_old_logprobs": True})) == []


def test_rank_engine_resolves_where_the_rank_runs(monkeypatch):
    from rpeg.runtime.engines import choice
    from tests.runtime.group_specs import group_spec

    def g(device, gen_tp=1, engine="auto"):
        return group_spec("g0", [0, 1], ["actor"], [], device_type=device, gen_tp=gen_tp,
                          gen_engine=engine)  # fmt: skip

    cfg = RunConfig()
    # a rank reads no plan: the compiled group carries the plan's engine
    cfg_path_plan = cfg.model_copy(update={"plan": "/nonexistent/plan.yaml"})
    assert choice.rank_engine(cfg_path_plan, g("cpu")) == "torch"
    monkeypatch.setattr(choice, "vllm_importable", lambda: True)
    assert choice.rank_engine(cfg_path_plan, g("cuda")) == "vllm"
    assert choice.rank_engine(cfg, g("cuda", gen_tp=2)) == "torch"
    assert choice.rank_engine(cfg, g("cuda", engine="torch")) == "torch"  # the plan's unit
    torch_cfg = cfg.with_overrides({"runtime.engine": "torch"})
    assert choice.rank_engine(torch_cfg, g("cuda")) == "torch"
    monkeypatch.setattr(choice, "vllm_importable", lambda: False)
    assert choice.rank_engine(cfg, g("cuda")) == "torch"
    with pytest.raises(ConfigError, match="not installed"):
        choice.rank_engine(cfg.with_overrides({"runtime.engine": "vllm"}), g("cuda"))


def test_build_engine_torch_is_a_private_copy(tiny):
    from rpeg.runtime.engines.choice import build_engine
    from rpeg.runtime.engines.torch_engine import TorchEngine

    model, tok = tiny
    eng = build_engine("torch", model, tok, config=RunConfig(), colocated=True)
    assert isinstance(eng, TorchEngine) and eng.model is not model
    a, b = next(eng.model.parameters()), next(model.parameters())
    assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()


def test_local_trainer_without_vllm_names_the_install_command(monkeypatch):
    from rpeg.runtime.engines import choice
    from rpeg.runtime.local_trainer import LocalTrainer

    monkeypatch.setattr(choice, "vllm_importable", lambda: False)
    cfg = RunConfig().with_overrides({"runtime.engine": "vllm", "optim.warmup_sft_steps": 0})
    with pytest.raises(ConfigError, match="scripts/vllm_env.sh DIR"):
        LocalTrainer(cfg)


def test_engine_problems_lists_what_check_engine_raises(monkeypatch):
    from rpeg.compile import compile_plan
    from rpeg.runtime.engines import choice
    from rpeg.runtime.engines.choice import engine_problems

    monkeypatch.setattr(choice, "vllm_importable", lambda: False)
    ok = RunConfig()
    assert engine_problems(ok, compile_plan(None, ok)) == []
    bad = RunConfig().with_overrides({"runtime.engine": "vllm"})
    got = engine_problems(bad, compile_plan(None, bad))
    assert got and all(p.where == "runtime.engine" for p in got)
    assert any("not installed" in p.what for p in got)
