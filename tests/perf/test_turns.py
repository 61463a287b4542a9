"""Multi-turn rollouts in the performance model (rpeg.perf.turns, rpeg.perf.turn_pricing):
the per-turn arithmetic worked by hand, and the pricing of a multi-turn config's graph (the
env stage's calls, re-prefill vs KV reuse, one turn = a single-turn generation)."""

import dataclasses

import pytest

from rpeg.perf import turns as T
from rpeg.perf.turns import Turns


def test_shares_of_samples_alive_per_turn():
    assert T.turn_shares(3) == [1.0, 1.0, 1.0]
    assert T.turn_shares(2.5) == [1.0, 1.0, 0.5]  # half the samples take a third turn
    assert T.turn_shares(1) == [1.0]


def test_prefill_tokens_re_prefill_vs_kv_reuse_by_hand():
    """Prompt 20, 3 turns of 32 tokens, 16 observation tokens between turns.
    Re-prefill: turn 1 prefills 20, turn 2 the prefix 20 + 32 + 16 = 68, turn 3
    68 + 48 = 116: 204 tokens. KV reuse: the prompt once, then only each observation: 20 + 16
    + 16 = 52."""
    assert T.prefill_tokens(20, 3, 32, 16, kv_reuse=False) == 204
    assert T.prefill_tokens(20, 3, 32, 16, kv_reuse=True) == 52
    # 2.5 turns: the third turn's prefix (116) for half the samples
    assert T.prefill_tokens(20, 2.5, 32, 16, kv_reuse=False) == 20 + 68 + 58
    assert T.prefill_tokens(20, 2.5, 32, 16, kv_reuse=True) == 20 + 16 + 8


def test_transcript_and_env_calls_by_hand():
    # 3 turns: 3 x 32 generated + 2 x 16 observed = 128; a reset and 3 steps (the last one
    # scores the final answer)
    assert T.transcript_tokens(3, 32, 16) == 128
    assert T.env_calls(3) == 4
    # 2.5 turns: 2.5 x 32 + 1.5 x 16 = 104; 1 + 2.5 calls
    assert T.transcript_tokens(2.5, 32, 16) == 104
    assert T.env_calls(2.5) == 3.5


def test_env_seconds_bounded_concurrency_by_hand():
    """ceil(n / c) * latency for the resets and after every turn."""
    # 48 samples, 8 at once: 6 waves of 0.1 s for the resets and after each of 3 turns
    assert T.env_waves(48, 3, 8) == 24
    assert T.env_seconds(48, 3, 0.1, 8) == pytest.approx(2.4)
    # 20 samples: ceil(2.5) = 3 waves, 4 times -> 1.2 s
    assert T.env_seconds(20, 3, 0.1, 8) == pytest.approx(1.2)
    # 2.5 turns: 20 samples for the resets and turns 1-2, then 10: 3 + 3 + 3 + 2 -> 1.1 s
    assert T.env_seconds(20, 2.5, 0.1, 8) == pytest.approx(1.1)
    # one turn: the resets and the final answers' steps, 3 + 3 waves
    assert T.env_seconds(20, 1, 0.1, 8) == pytest.approx(0.6)


def test_kv_reuse_follows_the_engine():
    t = Turns(max_turns=3, max_turn_tokens=32, env_concurrency=8)
    assert not T.reuses_kv(t, "torch", "h100")  # RPEG's torch engine re-prefills
    assert T.reuses_kv(t, "vllm", "cpu")  # vLLM's prefix caching
    assert not T.reuses_kv(t, "auto", "cpu")  # auto on CPU: the torch engine
    assert T.reuses_kv(t, "auto", "h100")  # auto on a GPU: vLLM
    assert not T.reuses_kv(dataclasses.replace(t, kv_reuse=False), "vllm", "h100")


def test_turns_refuses_means_beyond_the_caps():
    with pytest.raises(ValueError, match="mean_turns must be in"):
        Turns(max_turns=2, max_turn_tokens=32, env_concurrency=8, mean_turns=3)
    with pytest.raises(ValueError, match="mean_turn_tokens must be in"):
        Turns(max_turns=2, max_turn_tokens=32, env_concurrency=8, mean_turn_tokens=40)
    with pytest.raises(ValueError, match="env_concurrency"):
        Turns(max_turns=2, max_turn_tokens=32, env_concurrency=0)


# --- the pricing of a multi-turn config -------------------------------------------------
def _tool_cfg(**over):
    from rpeg.config import RunConfig

    return RunConfig.from_yaml("configs/tool-cpu.yaml").with_overrides(
        {"cluster.num_devices": 2, "cluster.n_workers": 2, **over}
    )


def _predict(cfg, wl=None):
    from rpeg.compile import resolve
    from rpeg.perf import Workload, predict
    from rpeg.specs.hf import priced_model

    graph, plan = resolve(None, cfg)
    if wl is None:
        wl = Workload.from_config(cfg.workload, cfg.model.lora, cfg.task.multiturn)
    return predict(graph, plan, wl, model=priced_model(cfg.model)), wl


def test_env_stage_adds_waves_of_calls_by_hand():
    """tool-cpu on 2 data-parallel ranks: 6 prompts x 8 = 48 samples, 24 per rollout
    process; the resets and 3 turns, 8 calls at once: 4 x ceil(24 / 8) = 12 waves of 0.5 s =
    6.0 s more in the rollout unit than with a free environment."""
    over = {"task.multiturn.max_turns": 3}
    slow, _ = _predict(_tool_cfg(**over, **{"task.multiturn.env_latency_s": 0.5}))
    free, _ = _predict(_tool_cfg(**over, **{"task.multiturn.env_latency_s": 0.0}))
    unit = "generate+env"
    assert slow.stages[unit].kinds == ("generate", "env")
    assert slow.stages[unit].time_s - free.stages[unit].time_s == pytest.approx(6.0)
    assert slow.stages[unit].detail["env.env_calls_per_sample"] == 4
    assert slow.step_s - free.step_s == pytest.approx(6.0)


def test_re_prefill_and_kv_reuse_priced_per_turn():
    """Prompt 20, 3 turns of 32, 16 observation tokens (the hand example above): the torch
    engine on CPU re-prefills 204 tokens per sample, KV reuse 52, and costs less."""
    cfg = _tool_cfg(
        **{
            "workload.mean_prompt_tokens": 20,
            "workload.max_response_tokens": 128,
            "task.multiturn.max_turns": 3,
            "task.multiturn.max_turn_tokens": 32,
            "task.multiturn.mean_turn_tokens": 32,
            "task.multiturn.observation_tokens": 16,
        }
    )
    again, wl = _predict(cfg)
    reuse_wl = dataclasses.replace(wl, turns=dataclasses.replace(wl.turns, kv_reuse=True))
    reuse, _ = _predict(cfg, reuse_wl)
    d0, d1 = again.stages["generate+env"].detail, reuse.stages["generate+env"].detail
    assert d0["generate.prefill_tokens_per_sample"] == 204
    assert d1["generate.prefill_tokens_per_sample"] == 52
    assert d0["generate.kv_reuse"] == 0.0 and d1["generate.kv_reuse"] == 1.0
    assert reuse.stages["generate+env"].flops < again.stages["generate+env"].flops
    assert reuse.stages["generate+env"].time_s < again.stages["generate+env"].time_s
    # the trainer's passes see the transcript: 3 x 32 + 2 x 16 = 128 tokens per sample
    assert again.stages["train_actor"].flops == reuse.stages["train_actor"].flops


def test_one_turn_prices_as_a_single_turn_generation():
    """A multi-turn workload of one turn generates what a single-turn workload with the
    turn's cap and mean does: the same generate time; with a free environment (its calls:
    the reset and the final answer's step) nothing more."""
    from rpeg.perf import Workload

    cfg = _tool_cfg(
        **{
            "task.multiturn.max_turns": 1,
            "task.multiturn.mean_turn_tokens": 14,
            "task.multiturn.env_latency_s": 0.0,
        }
    )
    multi, wl = _predict(cfg)
    single_wl = dataclasses.replace(
        wl, turns=None, max_response_tokens=28, mean_response_tokens=14.0
    )
    assert isinstance(single_wl, Workload)
    from rpeg.compile import resolve
    from rpeg.ir import build
    from rpeg.perf import predict
    from rpeg.specs.hf import priced_model

    _, plan = resolve(None, cfg)
    g1 = build("grpo", use_reference=cfg.algorithm.use_reference)
    plan1 = plan.model_copy(
        update={
            "units": {("generate" if k == "generate+env" else k): v for k, v in plan.units.items()}
        }
    )
    single = predict(g1, plan1, single_wl, model=priced_model(cfg.model))
    assert multi.stages["generate+env"].detail["env.env_calls_per_sample"] == 2
    assert multi.stages["generate+env"].time_s == pytest.approx(single.stages["generate"].time_s)


def test_the_planner_prices_the_environment():
    """rpeg plan on a multi-turn config: the problem's graph has the env stage, its workload
    the turns, and the best plan's step grows by its waves of calls: the resets and 2 turns,
    48 samples over at most 2 rollout processes, 8 at once -> >= 3 x 3 waves of 1 s."""
    from rpeg.search.optimizer import optimize_problem
    from rpeg.search.problem import problem_from_config

    def best(latency):
        prob = problem_from_config(_tool_cfg(**{"task.multiturn.env_latency_s": latency}))
        assert [s.name for s in prob.base.env_stages] == ["env"]
        assert prob.workload.turns is not None and prob.workload.turns.max_turns == 2
        return optimize_problem(prob).best

    slow, free = best(1.0), best(0.0)
    assert slow.plan.graph.options["multiturn"] is True
    assert slow.step_s - free.step_s >= 9.0 - 1e-9
