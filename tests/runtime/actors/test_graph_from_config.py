"""The graph a run executes records the run's algorithm parameters, not the builder presets."""

import pytest

from rpeg.compile.sources import graph_from_config
from rpeg.config import RunConfig
from rpeg.ir import StageKind


@pytest.mark.parametrize("algo", ["grpo", "ppo", "rloo", "reinforce_pp"])
def test_config_values_reach_the_graph(algo):
    cfg = RunConfig().with_overrides(
        {
            "algorithm.name": algo,
            "algorithm.kl_coef": 0.123,
            "algorithm.clip_high": 0.28,
            "algorithm.loss_aggregation": "seq_mean_token_sum",
            "runtime.max_staleness": 2,
        }
    )
    g = graph_from_config(cfg)
    assert g.algorithm == algo and g.staleness == 2
    assert g.params["kl_coef"] == 0.123 and g.params["clip_high"] == 0.28
    assert g.params["loss_aggregation"] == "seq_mean_token_sum"


def test_shared_actor_critic_from_config_merges_the_critic_stages():
    cfg = RunConfig().with_overrides(
        {"algorithm.name": "ppo", "algorithm.share_actor_critic": True}
    )
    g = graph_from_config(cfg)
    assert g.shared_actor_critic
    kinds = {s.kind for s in g.stages}
    assert StageKind.train_critic not in kinds and StageKind.values not in kinds
