"""pp and cp plans compile into groups the ranks run (rpeg.runtime.parallel_layout), and what
they cannot run is refused by name before anything starts (rpeg.compile.stage_checks); the
search drops the same layouts under named reasons (rpeg.search.stage_rules)."""

from __future__ import annotations

import pytest

from rpeg.compile import compile_plan
from rpeg.errors import ConfigError
from tests.runtime.stage_run_cases import stage_config


@pytest.mark.parametrize(
    ("kw", "want"),
    [
        ({"pp": 2}, (1, 1, 2, 1, "1f1b", 2)),
        ({"pp": 2, "schedule": "interleaved_1f1b"}, (1, 1, 2, 1, "interleaved_1f1b", 2)),
        ({"cp": 2}, (1, 1, 1, 2, "1f1b", 2)),
        ({"pp": 2, "n": 4}, (2, 1, 2, 1, "1f1b", 2)),
        ({"pp": 2, "tp": 2, "n": 4}, (1, 2, 2, 1, "1f1b", 4)),
    ],
)
def test_pp_and_cp_plans_compile_into_the_groups_layout(tmp_path, kw, want):
    cfg = stage_config(tmp_path, **kw)
    step = compile_plan(cfg.plan, cfg)
    (g,) = step.actor_groups
    assert (g.dp, g.tp, g.pp, g.cp, g.pp_schedule, g.replica_ranks) == want
    assert g.gen_tp == 1 and not step.notes  # every model unit at the group's layout


def test_a_forward_unit_at_another_pp_runs_at_the_groups_layout_and_says_so(tmp_path):
    cfg = stage_config(tmp_path, pp=2, units_over={"ref_logprob": {"pp": 1}})
    step = compile_plan(cfg.plan, cfg)
    assert step.actor_groups[0].pp == 2
    assert any(
        "ref_logprob: pp=1, cp=1 runs at group g0's layout pp=2, cp=1 (1f1b)" in n
        for n in step.notes
    )


def _refused(cfg) -> str:
    with pytest.raises(ConfigError) as ei:
        compile_plan(cfg.plan, cfg)
    return str(ei.value)


def test_unrunnable_pp_and_cp_are_refused_by_name(tmp_path):
    # more pipeline chunks than layers: 8 layers, pp=8 interleaved = 16 chunks
    text = _refused(
        stage_config(
            tmp_path, n=8, pp=8, schedule="interleaved_1f1b", **{"workload.num_prompts": 8}
        )
    )
    assert "pp=8 (interleaved_1f1b)" in text and "needs >= 16 layers" in text
    # cp composes with dp only
    text = _refused(stage_config(tmp_path, n=4, cp=2, tp=2))
    assert "cp=2 with tp=2, pp=1: context parallelism composes with dp only" in text
    # stages keep dp replicas: no FSDP
    text = _refused(stage_config(tmp_path, n=4, pp=2, engine="fsdp"))
    assert "pp=2 with engine fsdp" in text
    # generation never runs on stages
    text = _refused(stage_config(tmp_path, pp=2, units_over={"generate": {"pp": 2}}))
    assert "plan.units.generate" in text and "pp=2, cp=1 on a generate unit" in text
    # a critic is neither pipelined nor sequence-sharded (the group as a PPO plan makes it)
    import dataclasses

    from rpeg.compile import resolve
    from rpeg.compile.stage_checks import stage_problems

    cfg = stage_config(tmp_path, cp=2)
    step = compile_plan(cfg.plan, cfg)
    g = dataclasses.replace(step.actor_groups[0], roles=("actor", "reference", "critic"))
    kinds = {t.name: tuple(t.kinds) for t in step.tasks}
    _, plan = resolve(cfg.plan, cfg)
    (p,) = stage_problems([g], kinds, plan, cfg, None)
    assert "cp=2 with a critic (value model) in the group" in str(p)


def test_fsdp_with_cp_compiles_sharded_over_the_dp_x_cp_ranks(tmp_path):
    from rpeg.runtime.mesh import Layout

    for n in (2, 4):  # cp=2 alone, cp=2 x dp=2
        cfg = stage_config(tmp_path, n=n, cp=2, engine="fsdp")
        (g,) = compile_plan(cfg.plan, cfg).actor_groups
        assert (g.cp, g.dp, g.fsdp) == (2, n // 2, True)
        assert Layout.from_group(g).sharded  # the ranks build on meta and shard over dp x cp


def test_a_model_family_the_stages_do_not_run_is_refused(tmp_path):
    from rpeg import specs

    cfg = stage_config(tmp_path, pp=2)
    from rpeg.search.stage_rules import STAGE_FAMILIES

    other = next(
        m
        for m in specs.models().values()
        if m.family not in STAGE_FAMILIES and m.moe is None and m.layers >= 2
    )
    with pytest.raises(ConfigError) as ei:
        compile_plan(cfg.plan, cfg, model=other)
    assert f"pp/cp on model family {other.family!r}" in str(ei.value)


def test_the_search_keeps_pp_and_cp_layouts_and_counts_what_it_drops():
    from rpeg.search.space import SearchSpace, SpaceOptions
    from tests.plan.conftest import gh200_problem

    prob = gh200_problem(gpus=8)
    s = SearchSpace(
        prob.base,
        prob.cluster,
        prob.model,
        num_devices=8,
        max_seq_tokens=prob.max_seq_tokens,
        options=SpaceOptions(tp=(1, 2), pp=(1, 2), cp=(1, 2), cp_min_seq_tokens=0),
    )
    train = s.layouts("train", 8)
    assert any(x.pp == 2 and x.engine == "auto" for x in train)
    assert any(x.cp == 2 and x.tp == 1 for x in train)
    assert not any(x.cp > 1 and (x.tp > 1 or x.pp > 1) for x in train)
    assert not any(x.pp > 1 and x.engine == "fsdp" for x in train)
    # FSDP composes with cp (FSDP2 over the dp x cp ranks: rpeg.runtime.context_parallel):
    # engine auto runs it on GPUs at dp > 1 (fsdp there is the same layout, not repeated)
    from rpeg.plan.schema import trains_fsdp

    dp = {x: 8 // (x.tp * x.pp * x.cp) for x in train}
    assert any(
        x.cp == 2 and trains_fsdp(x.engine, cuda=True, dp=dp[x], pp=x.pp, cp=x.cp) for x in train
    )
    reasons = s.counts.to_dict()["infeasible"]
    assert reasons["runtime: cp with tp or pp (context parallelism composes with dp only)"] > 0
    assert reasons["runtime: pp with fsdp (pipeline stages keep dp replicas)"] > 0
