"""A training unit's ``engine: auto`` means one thing to the compiler, the performance model
and the search: FSDP on CUDA devices at dp > 1 without pp (at cp over the dp x cp ranks),
replicas otherwise
(rpeg.plan.schema.trains_fsdp). Before, the model priced AdamW state over dp while the ranks
kept it whole on each replica: a GPU plan could be priced as fitting and not fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from rpeg import specs
from rpeg.compile import compile_plan
from rpeg.compile.sources import resolve
from rpeg.perf import predict
from rpeg.plan.schema import trains_fsdp
from rpeg.preflight import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize(
    "engine, cuda, dp, pp, cp, fsdp",
    [
        ("auto", True, 8, 1, 1, True),
        ("auto", True, 1, 1, 1, False),  # one rank: nothing to shard over
        ("auto", True, 4, 2, 1, False),  # pipeline stages keep dp replicas
        ("auto", True, 4, 1, 2, True),  # sequence shards: FSDP over the dp x cp ranks
        ("auto", True, 1, 1, 2, False),  # cp without dp: replicas under auto
        ("auto", False, 2, 1, 1, False),  # CPU workers keep replicas
        ("fsdp", False, 2, 1, 1, True),
        ("torch", True, 8, 1, 1, False),
    ],
)
def test_the_rule(engine, cuda, dp, pp, cp, fsdp):
    assert trains_fsdp(engine, cuda=cuda, dp=dp, pp=pp, cp=cp) is fsdp


def _gpu_config(engine: str, devices: str = "0-7"):
    cfg = load_config(str(CONFIGS / "qwen7b-8gpu.yaml"))
    over = {f"plan.units.{u}.engine": engine for u in ("ref_logprob", "old_logprob", "train_actor")}
    over |= {f"plan.units.{u}.devices": devices for u in cfg.plan["units"]}
    return cfg.with_overrides(over)


def _predict(cfg, **kw):
    graph, plan = resolve(None, cfg)
    return predict(graph, plan, cfg.workload, model=specs.model("qwen2.5-7b-instruct"), **kw)


def _group(cfg):
    step = compile_plan(
        None, cfg, cluster_devices=cfg.cluster.num_devices, model=specs.model(cfg.model.name)
    )
    (g,) = step.actor_groups
    return g


def test_the_compiler_runs_fsdp_where_the_model_prices_it():
    model = specs.model("qwen2.5-7b-instruct")
    gb = model.params / 1e9
    for engine, fsdp in (("auto", True), ("fsdp", True), ("torch", False)):
        cfg = _gpu_config(engine)
        g = _group(cfg)
        assert (g.fsdp, g.dp) == (fsdp, 8), engine
        pred = _predict(cfg, check_memory=False)
        mem = pred.stages["train_actor"].memory_gb
        ref = pred.stages["ref_logprob"].memory_gb
        # 12 B of fp32 master + Adam m, v per parameter: over 8 ranks under FSDP, whole on
        # each replica; the reference in the group's layout
        shards = 8 if fsdp else 1
        assert mem["optimizer"] == pytest.approx(12 * gb / shards, rel=1e-6), engine
        assert mem["weights"] == pytest.approx(2 * gb / shards, rel=1e-6), engine
        assert ref["weights"] == pytest.approx(2 * gb / shards, rel=1e-6), engine


def test_a_replicated_7b_does_not_fit_an_h100_and_is_refused_before_start():
    from rpeg.plan.schema import InfeasiblePlan

    cfg = _gpu_config("torch")
    with pytest.raises(InfeasiblePlan) as e:
        _predict(cfg)
    assert e.value.reason == "memory"
    _predict(_gpu_config("auto"))  # fits


def test_one_gpu_and_cpu_workers_keep_replicas():
    one = _gpu_config("auto", devices="0").with_overrides({"plan.units.generate.tp": 1})
    assert not _group(one).fsdp
    cfg = load_config(str(CONFIGS / "dp2-cpu.yaml"))
    (g, *_) = compile_plan(None, cfg).actor_groups
    assert g.dp == 2 and not g.fsdp
