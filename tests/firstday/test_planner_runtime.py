"""`rpeg plan` emits only plans the runtime accepts for the workload: every plan of a grid of
workloads (devices x prompts per step) compiles with the runtime's own checks (was: dp=5
does not divide workload.num_prompts=12; 6 data-parallel ranks but only 4 prompts)."""

import itertools

import pytest

from rpeg.config import RunConfig
from rpeg.errors import ConfigError


def _cfg(gpus: int, prompts: int, minibatches: int = 1) -> RunConfig:
    return RunConfig().with_overrides(
        {
            "workload.num_prompts": prompts,
            "workload.samples_per_prompt": 2,
            "workload.train_minibatches": minibatches,
            "cluster.num_devices": gpus,
            "cluster.n_workers": gpus,
        }
    )


def test_layouts_follow_the_runtime_data_parallel_rules():
    from rpeg.search.problem import problem_from_config, search_space
    from rpeg.search.space import Layout

    space = search_space(problem_from_config(_cfg(8, 6, minibatches=4)))
    # 8 ranks for 6 prompts: two ranks would get none
    assert space._prompts_invalid("train", Layout(), 8).startswith("runtime: ")
    # 4 ranks for 6 prompts: ranks get 1 or 2 prompts = 2 or 4 samples < 4 mini-batches
    assert space._prompts_invalid("train", Layout(), 4).startswith("runtime: ")
    assert space._prompts_invalid("train", Layout(), 3) == ""  # 2 prompts each
    assert space._prompts_invalid("none", Layout(), 8) == ""  # a reward unit: no ranks


@pytest.mark.slow
def test_every_emitted_plan_compiles_for_its_workload():
    from rpeg.compile import compile_plan
    from rpeg.search import optimize

    refused, planned = [], 0
    for gpus, prompts in itertools.product((4, 6, 8), (3, 4, 5, 12)):
        cfg = _cfg(gpus, prompts)
        try:
            res = optimize(cfg, max_candidates=200)
        except Exception as exc:  # noqa: BLE001 -- no plan at all is allowed, and said
            assert "no feasible plan" in str(exc)
            continue
        for p in [res.best, *(getattr(res, "alternatives", None) or [])]:
            planned += 1
            try:
                compile_plan(p.plan, cfg, cluster_devices=gpus)
            except ConfigError as exc:
                refused.append((gpus, prompts, [x.what for x in exc.problems]))
    assert planned > 20
    assert refused == []
