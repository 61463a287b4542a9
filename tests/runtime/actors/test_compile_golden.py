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
from rpeg.ir import bound_async, build, fuse, share_actor_critic
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
        plan = plan.model_copy(
            update={"graph": plan.graph.model_copy(update={"inline": graph.to_dict()})}
        )
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
    assert s.weight_sync["mode"] == "bucketed"
    assert s.task("old_logprob").after == ["ref_logprob"]  # same devices: in order
    c = _compile("grpo_k0_colocated_dp2")
    assert c.weight_sync["mode"] == "shared" and c.actor_groups[0].world_size == 2


def test_fused_shared_actor_critic_is_one_forward():
    s = _compile("ppo_shared_fused_k2")
    t = s.task("ref_logprob+old_logprob")
    assert t.fused and t.shared_forward and s.shared_actor_critic and s.staleness == 2


def test_bad_plans_are_refused_with_every_problem():
    plan = disaggregated_plan(build("grpo"), gen_devices=4, train_devices=4)
    with pytest.raises(ConfigError, match="asks for 8 devices"):
        compile_plan(plan, CFG)
    bad = plan.model_copy(update={"units": {**plan.units, "nope": plan.units["generate"]}})
    with pytest.raises(ConfigError) as ei:
        compile_plan(bad, CFG)
    text = str(ei.value)
    assert "unknown execution unit" in text and "devices" in text
