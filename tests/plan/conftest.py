"""Shared small problems for the optimizer tests (fast: seconds, not minutes)."""

import pytest

from rpeg.search.inputs import config_from_kwargs
from rpeg.search.problem import problem_from_config
from rpeg.search.space import SpaceOptions


def gh200_problem(gpus=8, model="qwen2.5-7b", algo="grpo", k=1, **kw):
    cfg = config_from_kwargs(
        dict(
            model=model,
            gpu="gh200",
            gpus=gpus,
            algo=algo,
            num_prompts=64,
            samples_per_prompt=8,
            max_response_tokens=4096,
            max_staleness=k,
            **kw,
        )
    )
    return problem_from_config(cfg)


def cpu_problem(k=1, algo="grpo"):
    from rpeg.config import RunConfig

    cfg = RunConfig.from_dict({"algorithm": {"name": algo}, "runtime": {"max_staleness": k}})
    return problem_from_config(cfg)


# a deliberately small space: exhaustive enumeration of it takes a few seconds
SMALL = SpaceOptions(
    max_staleness=1,
    tp=(1, 2, 4),
    pp=(1, 2),
    cp=(1,),
    micro_batch_sizes=(1,),
    recompute=(True,),
    engines=("auto",),
    gen_pp=(1,),
    fusions=("none", "rollout"),
    offload=(True, False),
)


@pytest.fixture
def small_space():
    return SMALL
