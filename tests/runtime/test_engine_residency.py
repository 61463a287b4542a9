"""Sleep and wake of a colocated generation engine (rpeg.runtime.engines.residency), wired
into the runtime: over two steps of the local trainer on a fake ``vllm`` package
(tests/runtime/fake_vllm.py), the engine sleeps after each rollout and, at each weight sync,
wakes its weights, takes the update, then wakes its KV cache; nothing of the kind happens for
a generator that is not colocated, for the torch engine, or on a platform without sleep mode
(where the fake, like vLLM, refuses sleep mode and the run says so once).
tests/runtime/test_vllm_gpu.py checks on CUDA that sleeping frees device memory."""

from __future__ import annotations

import sys

import pytest
from fake_vllm import FakeLLM, fake_vllm_module

from rpeg.config import RunConfig
from rpeg.runtime.engines.residency import NO_SLEEP_NOTICE, EngineResidency
from rpeg.runtime.engines.vllm import VLLMEngine

CFG = {"runtime.engine": "vllm", "optim.warmup_sft_steps": 0}


def _with_fake_vllm(monkeypatch, *, platform_sleep: bool):
    mod = fake_vllm_module(platform_sleep=platform_sleep)
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setitem(sys.modules, "vllm.platforms", mod.platforms)
    return mod


def _events(llm: FakeLLM) -> list[tuple]:
    """The engine-level calls that matter here, in order: generate, sleep/wake, the update RPC."""
    out = []
    for c in llm.calls:
        if c[0] == "generate":
            out.append(("generate",))
        elif c[0] in ("sleep", "wake_up"):
            out.append(c[:2])
        elif c[0] == "rpc" and c[1] == "rpeg_receive_weights":
            out.append(("update",))
    # the engine's first weights arrive as an update when it is built (VLLMEngine.from_source),
    # before any rollout and with nothing asleep: the events after it are the steps'
    assert out[:1] == [("update",)], out
    return out[1:]


def _two_steps(cfg, log=None):
    from rpeg.runtime.local_trainer import LocalTrainer

    trainer = LocalTrainer(cfg, log=log)
    try:
        metrics = [trainer.step(), trainer.step()]
    finally:
        trainer.close()
    return trainer, metrics


def test_a_colocated_engine_sleeps_after_each_rollout_and_wakes_around_the_update(monkeypatch):
    mod = _with_fake_vllm(monkeypatch, platform_sleep=True)
    trainer, metrics = _two_steps(RunConfig().with_overrides(CFG))
    (llm,) = mod.built
    assert llm.enable_sleep_mode and trainer.residency.active
    one_step = [
        ("generate",),
        ("sleep", 1),  # the trainer runs with the engine's weights offloaded, no KV cache
        ("wake_up", ("weights",)),  # the weights first ...
        ("update",),  # ... take the new ones ...
        ("wake_up", ("kv_cache",)),  # ... then the KV cache, before the next rollout
    ]
    assert _events(llm) == one_step * 2
    assert all(m["weight_sync_bytes"] > 0 for m in metrics)
    assert trainer.actor.engine.asleep == set()


def test_a_platform_without_sleep_mode_runs_awake_and_says_so_once(monkeypatch):
    mod = _with_fake_vllm(monkeypatch, platform_sleep=False)
    lines: list[str] = []
    trainer, _ = _two_steps(RunConfig().with_overrides(CFG), log=lines.append)
    (llm,) = mod.built
    assert not llm.enable_sleep_mode  # asked for (colocated), refused by the platform: dropped
    assert trainer.actor.engine.sleep_refused and not trainer.residency.active
    assert _events(llm) == [("generate",), ("update",)] * 2  # no sleep, no wake
    assert lines.count(NO_SLEEP_NOTICE) == 1


def test_the_fake_refuses_sleep_mode_where_the_platform_has_none():
    with pytest.raises(ValueError, match="Sleep mode is not supported on current platform"):
        FakeLLM(1, [], enable_sleep_mode=True, platform_sleep=False)
    awake = FakeLLM(1, [])  # built without sleep mode: sleep/wake are refused
    with pytest.raises(RuntimeError, match="enable_sleep_mode"):
        awake.sleep(level=1)
    with pytest.raises(RuntimeError, match="enable_sleep_mode"):
        awake.wake_up(tags=["weights"])


def test_a_generator_that_is_not_colocated_never_sleeps():
    llm = FakeLLM(1, [], enable_sleep_mode=True)
    eng = VLLMEngine(llm, pad_id=0, eos_id=2, sleep_mode=True, sampling_params_cls=dict)
    lines: list[str] = []
    res = EngineResidency(eng, colocated=False, log=lines.append)
    for _ in range(2):
        res.after_rollout()
        res.before_update()
        res.after_update()
    assert not res.active and llm.calls == [] and lines == []


def test_the_torch_engine_has_no_sleep_and_the_helper_leaves_it_alone():
    from rpeg.runtime.engines.torch_engine import TorchEngine

    trainer, _ = _two_steps(RunConfig().with_overrides({"optim.warmup_sft_steps": 0}))
    assert isinstance(trainer.actor.engine, TorchEngine)
    assert not hasattr(trainer.actor.engine, "sleep")  # a call would have raised
    assert not trainer.residency.active


def test_wake_up_by_tag_wakes_only_what_sleeps():
    llm = FakeLLM(1, [], enable_sleep_mode=True)
    eng = VLLMEngine(llm, pad_id=0, eos_id=2, sleep_mode=True, sampling_params_cls=dict)
    eng.wake_up(tags=("weights",))  # awake: nothing to do
    eng.sleep()
    eng.wake_up(tags=("weights",))
    eng.wake_up(tags=("weights",))  # already awake
    eng.wake_up()  # the rest
    assert llm.calls == [("sleep", 1), ("wake_up", ("weights",)), ("wake_up", ("kv_cache",))]


# --------------------------------------------------------------------------- a rank actor
UNITS = ("generate", "reward", "ref_logprob", "old_logprob", "advantage", "train_actor")


def _rank(trainable: bool):
    """One in-process rank of a one-device plan (every unit on device 0), vLLM engine."""
    from rpeg.compile import compile_plan
    from rpeg.runtime.actors.programs import group_program
    from rpeg.runtime.actors.rank import RankActor

    cfg = RunConfig().with_overrides(
        {
            **CFG,
            "cluster.n_workers": 1,
            "cluster.num_devices": 1,
            "plan": {
                "cluster": "local-cpu",
                "model": "rpeg-tiny",
                "graph": {"builder": None},
                "units": {u: {"devices": "0"} for u in (*UNITS, "sync_weights")},
            },
        }
    )
    (g,) = [g for g in compile_plan(None, cfg).actor_groups if "generate" in g.units]
    if not trainable:  # a separate generator group (async plans): generates only
        import dataclasses

        g = dataclasses.replace(g, roles=("actor",), trainable=())
    program = group_program(cfg, g, staleness=0, async_rollout=not trainable)
    return cfg, RankActor(program, 0)


def _rank_steps(cfg, rank, kinds):
    from rpeg.runtime.actors.row_shards import PromptShard
    from rpeg.runtime.task_data import build_task_data

    cursor, _ = build_task_data(cfg.task, rank.models.tokenizer, cfg.workload.max_prompt_tokens)
    try:
        for step in range(2):
            shard = PromptShard(first=0, examples=tuple(cursor.next(cfg.workload.num_prompts)))
            from tests.runtime.group_specs import unit_call

            rank.run_unit(step, unit_call(cfg, kinds, shard))
    finally:
        rank.close()


def test_a_colocated_rank_sleeps_after_its_rollout_and_wakes_around_its_sync(monkeypatch):
    mod = _with_fake_vllm(monkeypatch, platform_sleep=True)
    cfg, rank = _rank(trainable=True)
    _rank_steps(cfg, rank, (*UNITS, "sync_weights"))
    (llm,) = mod.built
    step = [("generate",), ("sleep", 1), ("wake_up", ("weights",)), ("update",)]
    assert _events(llm) == [*step, ("wake_up", ("kv_cache",))] * 2


def test_a_separate_generator_rank_never_sleeps(monkeypatch):
    mod = _with_fake_vllm(monkeypatch, platform_sleep=True)
    cfg, rank = _rank(trainable=False)
    assert not rank.models.residency.active
    _rank_steps(cfg, rank, ("generate",))
    (llm,) = mod.built
    assert not llm.enable_sleep_mode  # built awake: a sleep/wake call would have raised
    assert _events(llm) == [("generate",)] * 2


def test_the_trainers_cached_memory_is_released_before_each_wake(monkeypatch):
    """Before a sleeping engine wakes (weights, then the KV cache), the trainer's cached
    CUDA blocks go back to the device (residency.release_cached_memory; on CUDA it is
    torch.cuda.empty_cache: tests/runtime/test_vllm_gpu.py): here its calls are recorded in
    the engine's order of events."""
    from rpeg.runtime.engines import residency

    mod = _with_fake_vllm(monkeypatch, platform_sleep=True)
    released: list[int] = []
    monkeypatch.setattr(
        residency, "release_cached_memory", lambda: released.append(len(mod.built[0].calls))
    )
    trainer, _ = _two_steps(RunConfig().with_overrides(CFG))
    (llm,) = mod.built
    wakes = [i for i, c in enumerate(llm.calls) if c[0] == "wake_up"]
    assert released == wakes  # each release right before a wake_up, none elsewhere
    assert len(released) == 4  # two steps, two wakes each


def test_release_cached_memory_is_a_no_op_without_cuda():
    import torch

    from rpeg.runtime.engines.residency import release_cached_memory

    assert release_cached_memory() is (torch.cuda.is_available() and torch.cuda.is_initialized())
