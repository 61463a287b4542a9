"""Every plan shape the search can emit for the CPU cluster compiles, and runs.

The space of ``rpeg plan --cluster local-cpu --gpus 4`` (k up to 1, every fusion, colocated
and every disaggregated split, every layout the space keeps for a unit) is enumerated with
the optimizer's own :class:`~rpeg.search.space.SearchSpace` and ``Evaluator.plan``; each plan
compiles. One plan per (structure, device split) then runs one step on a 4-worker
LocalCluster through the real flow (slow).
"""

from __future__ import annotations

import pytest

from rpeg.compile import compile_plan
from rpeg.config import RunConfig


def _config(tmp_path, k: int = 1) -> RunConfig:
    return RunConfig.from_dict(
        {
            "algorithm": {"kl_coef": 0.1},
            # 6 prompts: a pool of 1, 2 or 3 devices always gets whole, equal prompt groups
            "workload": {
                "num_prompts": 6,
                "samples_per_prompt": 2,
                "max_response_tokens": 6,
                "train_minibatches": 2,
            },
            "task": {"heldout_size": 2},
            "optim": {"warmup_sft_steps": 0},
            "cluster": {"name": "local-cpu", "num_devices": 4, "n_workers": 4},
            "runtime": {"max_staleness": k, "steps": 1, "output_dir": str(tmp_path / "out")},
        }
    )


def _shapes(cfg: RunConfig):
    """[(shape name, [plans])]: per (structure, placement), the plan with each unit's first
    layout and one plan per other layout of each unit."""
    from rpeg.search.evaluate import Evaluator
    from rpeg.search.problem import default_space, problem_from_config
    from rpeg.search.space import SearchSpace

    prob = problem_from_config(cfg)
    space = SearchSpace(
        prob.base,
        prob.cluster,
        prob.model,
        num_devices=prob.num_devices,
        max_seq_tokens=prob.max_seq_tokens,
        options=default_space(prob),
    )
    ev = Evaluator(prob, space)
    out = []
    for st, g in space.structures():
        for pl in space.placements(st):
            c = ev.cell(st, g, pl)
            cands = {n: ev.candidates(c, n) for n, _, _ in c.units}
            first = {n: v[0] for n, v in cands.items()}
            plans = [ev.plan(c, first)]
            for n, lays in cands.items():
                plans += [ev.plan(c, {**first, n: lay}) for lay in lays[1:]]
            out.append((f"{st.describe()}; {pl.describe()}", plans, (st, pl.gen_devices)))
    return out


def test_every_plan_the_search_can_emit_compiles(tmp_path):
    cfg = _config(tmp_path)
    shapes = _shapes(cfg)
    assert len(shapes) >= 8  # fusions x (colocated + splits) at k=0 and k=1
    n = 0
    for _name, plans, _key in shapes:
        for plan in plans:
            step = compile_plan(plan, cfg)
            assert step.num_devices <= 4
            n += 1
    assert n >= len(shapes)


@pytest.mark.slow
def test_one_step_of_every_plan_shape_runs(tmp_path, prefect_harness):
    from rpeg.flows.entry import train_on
    from rpeg.infra import start_cluster

    cfg = _config(tmp_path)
    shapes = _shapes(cfg)
    ran = []
    # offload / partial-rollout / plan-level streaming flags do not change what the runtime
    # runs: one run per (structure, device split)
    seen, todo = set(), []
    for name, plans, key in shapes:
        if key not in seen:
            seen.add(key)
            todo.append((name, plans))
    with start_cluster(n_workers=4, torch_threads=1) as cl:
        for i, (name, plans) in enumerate(todo):
            plan = plans[0]
            c = cfg.with_overrides({"runtime.output_dir": str(tmp_path / f"run{i}")})
            c = c.model_copy(update={"plan": plan.to_dict()})
            s = train_on(cl, c, progress=False)
            assert s["steps"] == 1, name
            ran.append(name)
    assert len(ran) == len(todo) >= 8
