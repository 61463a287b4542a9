"""Expert parallelism in plans (issue 40 items 3 and 5): the search keeps ep > 1 for a MoE
model the runtime splits (rpeg.search.ep_rules), such a plan compiles to a group with ``ep``,
and ep on a dense model, a family the runtime does not split or an ep that does not divide
the experts is refused by name."""

from __future__ import annotations

import pytest

from rpeg.compile import compile_plan
from rpeg.config import RunConfig
from rpeg.errors import ConfigError

WORKLOAD = {
    "gpu": "h100",
    "gpus": 8,
    "algo": "grpo",
    "num_prompts": 64,
    "samples_per_prompt": 8,
    "max_response_tokens": 4096,
    "max_staleness": 0,
}


def _config(model: str, gpus: int = 8) -> RunConfig:
    return RunConfig().with_overrides(
        {
            "model.name": model,
            "workload.num_prompts": 64,
            "workload.samples_per_prompt": 8,
            "workload.max_response_tokens": 4096,
            "cluster.name": "dgx-h100",
            "cluster.num_devices": gpus,
        }
    )


def _with_ep(plan, ep: int):
    units = {
        k: u.model_copy(update={"ep": ep}) if k.startswith(("train", "ref")) else u
        for k, u in plan.units.items()
    }
    return plan.model_copy(update={"units": units})


@pytest.fixture(scope="module")
def moe_result():
    from rpeg.search import optimize

    return optimize(None, model="qwen3-30b-a3b", **WORKLOAD)


def test_the_search_offers_ep_layouts_for_a_moe_model_and_they_compile(moe_result):
    plans = [moe_result.best, *(moe_result.alternatives or [])]
    ep_plans = [p for p in plans if any(u.ep > 1 for u in p.plan.units.values())]
    # 8 x h100: the best plan trains at ep=8 (each rank holds 16 of the 128 experts whole)
    assert ep_plans, "no plan with ep > 1 for qwen3-30b-a3b on 8 x h100"
    step = compile_plan(ep_plans[0].plan, _config("qwen3-30b-a3b"), cluster_devices=8)
    trainer = next(g for g in step.actor_groups if "actor" in g.trainable)
    assert trainer.ep > 1 and trainer.dp % trainer.ep == 0 and trainer.tp == 1


def test_the_search_space_keeps_ep_only_where_the_runtime_splits_experts():
    from rpeg.search.problem import search_space
    from rpeg.search.space import SpaceOptions
    from tests.plan.conftest import gh200_problem

    assert all(x.ep == 1 for x in search_space(gh200_problem(gpus=8)).layouts("train", 8))
    opts = SpaceOptions(tp=(1, 2), pp=(1,), cp=(1,), engines=("fsdp",))
    space = search_space(gh200_problem(gpus=8, model="qwen3-30b-a3b"), opts)
    kept = space.layouts("train", 8)
    assert {x.ep for x in kept} == {1, 2, 4, 8}
    assert all(x.tp == 1 for x in kept if x.ep > 1)
    reasons = space.counts.to_dict()["infeasible"]
    assert reasons["runtime: ep>1 with tp/pp/cp>1 (ep composes with dp and FSDP only)"] > 0


def test_ep_is_refused_by_name_on_a_dense_model_a_family_it_does_not_split_and_bad_divisors(
    moe_result,
):
    from rpeg.search import optimize

    dense = optimize(None, model="qwen2.5-7b", **WORKLOAD).best.plan
    with pytest.raises(ConfigError, match="'qwen2.5-7b' has no experts to split"):
        compile_plan(_with_ep(dense, 2), _config("qwen2.5-7b"), cluster_devices=8)
    moe = moe_result.best.plan
    with pytest.raises(ConfigError, match="ep=3 does not divide 'qwen3-30b-a3b''s 128 experts"):
        compile_plan(_with_ep(moe, 3), _config("qwen3-30b-a3b"), cluster_devices=8)
    with pytest.raises(ConfigError, match="family 'deepseek'"):
        compile_plan(_with_ep(moe, 2), _config("deepseek-v3"), cluster_devices=8)


def test_generation_on_the_split_weights_is_said(tmp_path):
    """A colocated group whose generation tp equals its training tp decodes on the weights
    split at the group's ep: the compiled step says so for the generate unit (and for the
    forward units run at the group's ep)."""
    from rpeg.specs.hf import priced_model
    from tests.runtime.models.tiny_folders import write_tiny_folder

    folder = write_tiny_folder("qwen3_moe", tmp_path / "moe")
    units = {u: {"devices": "0-1"} for u in ("generate", "reward", "advantage", "sync_weights")}
    units |= {u: {"devices": "0-1"} for u in ("ref_logprob", "old_logprob")}
    units["train_actor"] = {"devices": "0-1", "engine": "fsdp", "ep": 2}
    cfg = RunConfig.from_dict(
        {
            "model": {"path": str(folder)},
            "workload": {"num_prompts": 2, "samples_per_prompt": 2},
            "cluster": {"name": "local-cpu", "n_workers": 2, "num_devices": 2},
            "plan": {"cluster": "local-cpu", "graph": {"builder": None}, "units": units},
        }
    )
    step = compile_plan(None, cfg, model=priced_model(cfg.model))
    (g,) = step.actor_groups
    assert (g.dp, g.ep, g.fsdp) == (2, 2, True)
    assert any(n.startswith("plan.units.generate.ep=1: decodes on") for n in step.notes)
    assert any(n.startswith("plan.units.ref_logprob.ep=1: runs at") for n in step.notes)


def test_ep_ranks_need_equal_prompt_shards():
    """Every forward of a split model is an all-to-all: like FSDP, dp replicas at ep > 1 must
    see equal batches (compile and the search)."""
    from rpeg.compile import GroupSpec
    from rpeg.compile.checks import batch_problems
    from rpeg.search.problem import problem_from_config, search_space
    from rpeg.search.space import Layout

    g = GroupSpec("g", (0, 1), 2, ("actor",), ("actor",), (), dp=2, ep=2)
    w = RunConfig().with_overrides({"workload.num_prompts": 3}).workload
    (p,) = batch_problems([g], w)
    assert "dp=2 does not divide workload.num_prompts=3" in p.what
    cfg = _config("qwen3-30b-a3b", 2).with_overrides({"workload.num_prompts": 3})
    space = search_space(problem_from_config(cfg))
    assert (
        space._prompts_invalid("train", Layout(ep=2), 2)
        == "runtime: dp does not divide the prompts"
    )
    # replicas (engine torch) take unequal shards; engine auto runs FSDP on GPUs: refused too
    assert space._prompts_invalid("train", Layout(ep=1, engine="torch"), 2) == ""
    assert (
        space._prompts_invalid("train", Layout(ep=1), 2)
        == "runtime: dp does not divide the prompts"
    )
