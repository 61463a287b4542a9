"""PPO on Dask actors: a separate critic and a shared actor-critic trunk both train, and the
distributed run reproduces the single-process trainer's first step."""

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("shared", [False, True])
def test_ppo_trains_on_actors_like_the_local_trainer(
    tmp_path, prefect_harness, dask_cluster, make_config, shared
):
    from rpeg.flows.entry import train_on

    from rpeg.runtime.local_trainer import LocalTrainer

    cfg = make_config(
        tmp_path,
        **{
            "runtime.steps": 2,
            "algorithm.name": "ppo",
            "algorithm.share_actor_critic": shared,
        },
    )
    ref = LocalTrainer(cfg).step()
    s = train_on(dask_cluster, cfg, progress=False)
    hist = s["_extra"]["history"]
    assert len(hist) == 2
    assert "value_loss" in hist[0]  # the critic (or the shared value head) trained
    if shared:
        assert hist[0]["shared_forward"] == 1.0  # old log-probs and values from one forward
    for key in ("pg_loss", "value_loss", "entropy", "kl"):
        assert abs(hist[0][key] - ref[key]) <= 1e-4 * max(1.0, abs(ref[key])), key
