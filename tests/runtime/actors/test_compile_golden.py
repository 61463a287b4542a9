"""Golden files of the compile output (plain data) for each pipeline kind.

Regenerate after an intended change: ``RPEG_REGEN_GOLDEN=1 pytest tests/runtime/actors/test_compile_golden.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from rpeg.compile import CompiledStep, compile_plan
from rpeg.config import RunConfig
from rpeg.errors import ConfigError
from rpeg.ir import bound_async, build, fuse, share_actor_critic, to_dict
from rpeg.plan import colocated_plan, disaggregated_plan

GOLDEN = Path(__file__).parent / "golden"
CFG = RunConfig.from_dict(
    {"workload": {"num_prompts": 4, "samples_per_prompt": 2}, "cluster": {"n_workers": 4}}
)


def _grpo_k0():
    return colocated_plan(build("grpo"), num_devices=2, builder="grpo")


def _grpo_k1_fused():
    g = fuse(bound_async(build("grpo"), 1), ["generate", "reward"])
    return disaggregated_plan(
        g, gen_devices=1, train_devices=1, builder="grpo", builder_options={"staleness": 1}
    ), g


def _ppo_k0():
    return disaggregated_plan(build("ppo"), gen_devices=2, train_devices=2, builder="ppo")


def _ppo_shared_fused_k2():
    g = fuse(share_actor_critic(bound_async(build("ppo"), 2)), ["ref_logprob", "old_logprob"])
    return disaggregated_plan(g, gen_devices=1, train_devices=1), g


def _rloo_k1():
    return disaggregated_plan(
        build("rloo", staleness=1),
        gen_devices=1,
        train_devices=2,
        builder="rloo",
        builder_options={"staleness": 1},
    )


def _reinforce_pp_fused():
    g = fuse(build("reinforce_pp"), ["generate", "reward"])
    return colocated_plan(g, num_devices=1), g


CASES = {
    "grpo_k0_colocated_dp2": _grpo_k0,
    "grpo_k1_fused_disaggregated": _grpo_k1_fused,
    "ppo_k0_disaggregated": _ppo_k0,
    "ppo_shared_fused_k2": _ppo_shared_fused_k2,
    "rloo_k1_disaggregated_dp2": _rloo_k1,
    "reinforce_pp_fused_colocated": _reinforce_pp_fused,
}


def _compile(case: str) -> CompiledStep:
    got = CASES[case]()
    plan, graph = got if isinstance(got, tuple) else (got, None)
    if graph is not None:
        plan = plan.with_inline_graph(to_dict(graph))
    return compile_plan(plan, CFG)


@pytest.mark.parametrize("case", sorted(CASES))
def test_compile_matches_golden(case):
    step = _compile(case)
    text = step.to_yaml()
    path = GOLDEN / f"{case}.yaml"
    if os.environ.get("RPEG_REGEN_GOLDEN") or not path.exists():
        path.write_text(text)
    assert yaml.safe_load(text) == yaml.safe_load(path.read_text())
    # round trip through plain data
    assert CompiledStep.from_dict(yaml.safe_load(text)).to_dict() == step.to_dict()


def test_disjoint_devices_overlap_and_colocated_units_are_ordered():
    s = _compile("ppo_k0_disaggregated")
    assert s.weight_sync.mode == "bucketed"
    assert s.task("old_logprob").after == ("ref_logprob",)  # same devices: in order
    c = _compile("grpo_k0_colocated_dp2")
    assert c.weight_sync.mode == "shared" and c.actor_groups[0].world_size == 2


def test_fused_shared_actor_critic_is_one_forward():
    s = _compile("ppo_shared_fused_k2")
    t = s.task("ref_logprob+old_logprob")
    assert t.fused and t.shared_forward and s.staleness == 2
    # shared: no group holds a critic, the actor trains the value head (format 5 dropped the
    # step-level flag: nothing read it, and these two facts say it)
    assert all("critic" not in g.roles for g in s.actor_groups)


def test_a_step_of_another_format_is_refused_with_recompile():
    d = _compile("grpo_k0_colocated_dp2").to_dict()
    old = {**d, "format": 4, "shared_actor_critic": False}
    with pytest.raises(ConfigError, match="this RPEG reads format 5; recompile"):
        CompiledStep.from_dict(old)


def test_bad_plans_are_refused_with_every_problem():
    plan = disaggregated_plan(build("grpo"), gen_devices=4, train_devices=4)
    with pytest.raises(ConfigError, match="asks for 8 devices"):
        compile_plan(plan, CFG)
    bad = plan.model_copy(update={"units": {**plan.units, "nope": plan.units["generate"]}})
    with pytest.raises(ConfigError) as ei:
        compile_plan(bad, CFG)
    text = str(ei.value)
    assert "unknown execution unit" in text and "devices" in text


# --------------------------------------------------------------------------- layouts
def _sharded_plan(tp=2, gen_tp=None, n=4, engine="fsdp", algo="grpo"):
    plan = colocated_plan(build(algo), num_devices=n, tp=tp, gen_tp=gen_tp, builder=algo)
    units = {
        k: (u.model_copy(update={"engine": engine}) if k.startswith("train") else u)
        for k, u in plan.units.items()
    }
    return plan.model_copy(update={"units": units})


def test_tp_and_fsdp_plans_fill_the_group_layout():
    step = compile_plan(_sharded_plan(tp=2, gen_tp=2), CFG)
    (g,) = step.actor_groups
    assert (g.world_size, g.dp, g.tp, g.fsdp, g.gen_tp) == (4, 2, 2, True, 2)
    assert (g.device_type, g.backend, g.dtype) == ("cpu", "gloo", "float32")
    ddp = compile_plan(_sharded_plan(tp=1, engine="auto"), CFG).actor_groups[0]
    assert (ddp.dp, ddp.tp, ddp.fsdp) == (4, 1, False)


def test_forward_units_run_on_the_groups_training_layout_and_say_so():
    plan = _sharded_plan(tp=2, gen_tp=2)
    units = dict(plan.units)
    units["ref_logprob"] = units["ref_logprob"].model_copy(update={"tp": 4})
    step = compile_plan(plan.model_copy(update={"units": units}), CFG)
    assert step.actor_groups[0].tp == 2
    assert any("plan.units.ref_logprob.tp=4" in n and "tp=2" in n for n in step.notes)


def test_unrunnable_layouts_are_refused_naming_field_and_numbers():
    cfg = RunConfig.from_dict(
        {
            "workload": {"num_prompts": 3, "samples_per_prompt": 2, "train_minibatches": 1},
            "model": {"tiny_shape": {"num_attention_heads": 6, "num_key_value_heads": 6}},
            "cluster": {"n_workers": 4},
        }
    )
    plan = _sharded_plan(tp=4, gen_tp=4)
    units = dict(plan.units)
    units["train_actor"] = units["train_actor"].model_copy(update={"tp": 2, "cp": 2})
    with pytest.raises(ConfigError) as ei:
        compile_plan(plan.model_copy(update={"units": units}), cfg)
    text = str(ei.value)
    assert "cp=2 with tp=2, pp=1: context parallelism composes with dp only" in text
    # dp=2 over 3 prompts (sharded), heads 6 by tp 4
    plan = _sharded_plan(tp=2, gen_tp=2)
    with pytest.raises(ConfigError) as ei:
        compile_plan(plan, cfg)
    assert "dp=2 does not divide workload.num_prompts=3" in str(ei.value)
    with pytest.raises(ConfigError) as ei:
        compile_plan(_sharded_plan(tp=4, gen_tp=4), cfg)
    assert "tp=4 does not divide the model's num_attention_heads=6" in str(ei.value)


def test_the_search_space_drops_what_the_runtime_refuses_with_a_named_reason():
    from rpeg.search.space import UNSUPPORTED_DEGREES, SearchSpace, SpaceOptions
    from tests.plan.conftest import gh200_problem

    prob = gh200_problem(gpus=8)
    s = SearchSpace(
        prob.base,
        prob.cluster,
        prob.model,
        num_devices=8,
        max_seq_tokens=prob.max_seq_tokens,
        options=SpaceOptions(tp=(1, 2), pp=(1, 2), gen_pp=(1, 2), cp=(1,), engines=("auto",)),
    )
    assert all(x.pp == 1 and x.cp == 1 for x in s.layouts("gen", 8))
    assert any(x.pp == 2 for x in s.layouts("train", 8))  # the ranks run pipeline stages
    assert "pp" not in UNSUPPORTED_DEGREES and "cp" not in UNSUPPORTED_DEGREES
    reasons = s.counts.to_dict()["infeasible"]
    assert (
        reasons.get(
            "runtime: pp/cp on a generate unit (generation runs whole or tp-split weights)", 0
        )
        > 0
    )


def test_a_plan_with_partial_rollout_is_refused_by_name_and_never_searched():
    """The performance model prices AReaL's interruptible rollout (``partial_rollout``: no
    per-step tail, interrupted sequences re-prefilled); the runtime finishes every rollout on
    the weights it started with. So the compiler refuses the field by name, the planner's
    search space leaves it out, and a disaggregated plan does not set it unless asked."""
    from rpeg.search.space import SpaceOptions

    plan, graph = _grpo_k1_fused()
    assert plan.staleness == 1 and not plan.partial_rollout
    plan = plan.with_inline_graph(to_dict(graph))
    compile_plan(plan, CFG)  # runs as it is
    with pytest.raises(ConfigError) as ei:
        compile_plan(plan.model_copy(update={"partial_rollout": True}), CFG)
    text = str(ei.value)
    assert "plan.partial_rollout" in text and "allowed: false" in text
    assert SpaceOptions().partial_rollout == (False,)


def test_an_engine_the_runtime_does_not_run_is_refused_by_name():
    """The plan schema's ``megatron`` and ``sglang`` price published systems (rpeg validate);
    a plan asking RPEG's runtime for them is refused, naming the unit and the allowed ones,
    not run on the runtime's own trainer under another name."""
    from rpeg.compile.checks import RUNTIME_ENGINES
    from rpeg.search.space import SpaceOptions

    plan, graph = _grpo_k1_fused()
    plan = plan.with_inline_graph(to_dict(graph))
    train = next(n for n in plan.units if n.startswith("train"))
    gen = next(n for n in plan.units if "gen" in n)
    for unit, engine in ((train, "megatron"), (gen, "sglang")):
        units = {**plan.units, unit: plan.units[unit].model_copy(update={"engine": engine})}
        with pytest.raises(ConfigError) as ei:
            compile_plan(plan.model_copy(update={"units": units}), CFG)
        (problem,) = ei.value.problems
        assert problem.where == f"plan.units.{unit}.engine"
        assert repr(engine) in problem.what and "allowed: auto, torch, fsdp" in problem.what
    units = {**plan.units, train: plan.units[train].model_copy(update={"engine": "fsdp"})}
    compile_plan(plan.model_copy(update={"units": units}), CFG)  # its own FSDP runs
    # and the planner never proposes what the runtime refuses
    assert set(SpaceOptions().engines) <= set(RUNTIME_ENGINES)


def test_packing_compiles_into_a_token_budget_and_is_refused_by_name_where_rows_run_padded():
    """seq_packing (auto: packed at pp 1 and cp 1): a forward unit's micro-batches hold
    micro_batch_size x (prompt cap 32 + response cap 16) real tokens; a pipeline unit runs
    padded rows, so auto compiles it unpacked and an explicit true is refused by name."""
    plan = colocated_plan(build("grpo"), num_devices=2, builder="grpo")
    units = {
        n: u.model_copy(update={"micro_batch_size": 4}) if n.endswith("logprob") else u
        for n, u in plan.units.items()
    }
    step = compile_plan(plan.model_copy(update={"units": units}), CFG)
    ref = step.task("ref_logprob")
    assert ref.seq_packing and ref.max_tokens_per_micro_batch == 4 * (32 + 16)
    assert not step.task("generate").seq_packing and not step.task("reward").seq_packing
    off = {**units, "ref_logprob": units["ref_logprob"].model_copy(update={"seq_packing": False})}
    step = compile_plan(plan.model_copy(update={"units": off}), CFG)
    assert not step.task("ref_logprob").seq_packing
    assert step.task("ref_logprob").max_tokens_per_micro_batch is None  # by count
    piped = colocated_plan(build("grpo"), num_devices=2, pp=2, builder="grpo")
    assert not piped.units["train_actor"].packs()
    bad = piped.units["train_actor"].model_copy(update={"seq_packing": True})
    with pytest.raises(ConfigError) as ei:
        compile_plan(piped.model_copy(update={"units": {**piped.units, "train_actor": bad}}), CFG)
    text = str(ei.value)
    assert "plan.units.train_actor.seq_packing" in text and "allowed: false, auto" in text
