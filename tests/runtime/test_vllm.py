"""The vLLM engine without vLLM: HF weight names, requests, output conversion, the weight
update protocol over a fake ``LLM`` with several tensor-parallel workers, sleep/wake, and the
choice of engine from config and plan. (tests/runtime/test_vllm_gpu.py runs the real thing.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from fake_vllm import FakeLLM, check_wire, shard

from rpeg.config import RunConfig
from rpeg.errors import ConfigError, RpegError
from rpeg.runtime.engines.base import SamplingParams
from rpeg.runtime.engines.vllm import VLLMEngine
from rpeg.runtime.engines.vllm_requests import (
    hf_weight_names,
    sampling_kwargs,
    to_generation_output,
)
from rpeg.runtime.engines.vllm_transfer import (
    BucketPlan,
    pack_bucket,
    plan_buckets,
    unpack_bucket,
)
from rpeg.runtime.model_io import ActorCritic, create_tiny

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)


@pytest.fixture(scope="module")
def tiny():
    model, tok = create_tiny(seed=0, num_key_value_heads=2, **SMALL)
    return model, tok


# --------------------------------------------------------------------------- weight names
def test_hf_names_equal_the_safetensors_checkpoint(tiny, tmp_path):
    """The names sent are exactly the keys of the HF checkpoint save_pretrained writes (the
    layout vLLM's load_weights reads): tied lm_head and rotary buffers left out."""
    from safetensors import safe_open

    model, _ = tiny
    model.save_pretrained(tmp_path, safe_serialization=True)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    sd = model.state_dict()
    got = dict(hf_weight_names(sd, tie_word_embeddings=True))
    assert set(got) == saved
    assert "lm_head.weight" not in got
    assert got["model.embed_tokens.weight"] is sd["model.embed_tokens.weight"]  # no copy


def test_hf_names_unwrap_the_actor_critic_and_drop_its_value_head(tiny):
    model, _ = tiny
    wrapped = ActorCritic(model).state_dict()  # lm.model.layers..., value_head.proj.*
    assert any(k.startswith("value_head.") for k in wrapped)
    got = dict(hf_weight_names(wrapped, tie_word_embeddings=True))
    want = {n for n, _ in model.named_parameters()}  # HF dedups the tied head itself
    assert set(got) == want


def test_hf_names_strip_compile_fsdp_and_checkpoint_wrappers():
    t = torch.zeros(2)
    sd = {
        "_orig_mod.model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight": t,
        "module.model.layers.1._fsdp_wrapped_module.self_attn.q_proj.weight": t,
        "model.rotary_emb.inv_freq": t,
        "lm_head.weight": t,
    }
    got = [n for n, _ in hf_weight_names(sd, tie_word_embeddings=False)]
    assert got == [
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "lm_head.weight",
    ]
    with pytest.raises(RpegError, match="two entries"):
        hf_weight_names({"lm.x.weight": t, "x.weight": t}, tie_word_embeddings=False)


def test_plan_buckets_bound_the_bytes_and_keep_one_dtype_each():
    f = torch.zeros  # float32: 4 bytes an element
    named = [("a", f(10)), ("b", f(10)), ("c", f(30)), ("d", f(5)), ("e", f(3).double())]
    # offsets are rounded up to 16 elements: b starts at 16, so a+b take 26 elements (104 B)
    plan = plan_buckets(named, bucket_bytes=104)
    got = [[e.name for e in b.entries] for b in plan]
    assert got == [["a", "b"], ["c"], ["d"], ["e"]]  # 104; 120 alone; 20; a new dtype
    assert [b.dtype for b in plan] == ["float32"] * 3 + ["float64"]
    assert [(e.offset, e.numel) for e in plan[0].entries] == [(0, 10), (16, 10)]
    assert plan[0].numel == 26 and plan[0].nbytes == 104
    assert [[e.name for e in b.entries] for b in plan_buckets(named, 103)][:2] == [["a"], ["b"]]
    assert [[e.name for e in b.entries] for b in plan_buckets(named, 10**6)] == [
        ["a", "b", "c", "d"],
        ["e"],
    ]


def test_a_bucket_round_trips_through_its_wire_form():
    named = [("w", torch.arange(6.0).view(2, 3)), ("b", torch.tensor([7.0, 8.0]))]
    (plan,) = plan_buckets(named, 1 << 20)
    wire = plan.to_wire()
    check_wire(wire)  # plain lists: what vLLM's msgpack carries
    back = BucketPlan.from_wire(wire)
    assert back == plan
    flat = pack_bucket(back, dict(named))
    out = dict(unpack_bucket(back, flat))
    assert out["w"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert out["b"].tolist() == [7.0, 8.0]
    with pytest.raises(RpegError, match="unknown dtype"):
        BucketPlan.from_wire(["tensor", 1, []])


# --------------------------------------------------------------------------- a fake vLLM
def _engine(llm, tp, **kw):
    return VLLMEngine(
        llm,
        pad_id=0,
        eos_id=2,
        tensor_parallel_size=tp,
        tie_word_embeddings=True,
        sampling_params_cls=dict,
        timeout_s=60.0,
        **kw,
    )


def test_the_fake_refuses_tensors_as_rpc_arguments_like_vllms_engine_core():
    llm = FakeLLM(1, [])
    with pytest.raises(TypeError, match="Tensor cannot cross"):
        llm.collective_rpc("rpeg_receive_weights", args=([("w", torch.zeros(2))],))
    with pytest.raises(TypeError, match="kwargs"):
        llm.collective_rpc("x", kwargs={"t": torch.zeros(1)})


@pytest.mark.parametrize("tp", [1, 2])
def test_update_reaches_every_tp_rank_with_its_shard(tiny, tp):
    model, _ = tiny
    sd = {k: v.clone() + 1.0 for k, v in ActorCritic(model).state_dict().items()}
    names = [n for n, _ in model.named_parameters()]
    llm = FakeLLM(tp, names)
    eng = _engine(llm, tp, bucket_bytes=64 * 1024)
    try:
        eng.update_weights(sd, policy_version=7)
        eng.update_weights(sd, policy_version=8)  # the group is set up once
    finally:
        eng.shutdown()
    assert eng.policy_version == 8
    rpcs = [c[1] for c in llm.calls if c[0] == "rpc"]
    assert rpcs == [
        "rpeg_device",  # where the workers are: CPU, so gloo (chosen once)
        "rpeg_join_update_group",
        "rpeg_receive_weights",
        "rpeg_receive_weights",
        "rpeg_leave_update_group",
    ]
    assert eng.transport == "gloo"
    plan = [BucketPlan.from_wire(w) for w in llm.calls[2][2][0]]
    assert len(plan) > 1  # bucketed: 64 KiB each at most (a larger tensor alone)
    assert all(b.nbytes <= 64 * 1024 or len(b.entries) == 1 for b in plan)
    assert sorted(e.name for b in plan for e in b.entries) == sorted(names)
    assert eng.last_update.buckets == len(plan)
    assert eng.last_update.nbytes == sum(b.nbytes for b in plan)
    assert eng.last_update.tensors == len(names)
    assert ("reset_prefix_cache",) in llm.calls
    for r, w in enumerate(llm.workers):
        loaded = w.model_runner.model.loaded
        assert set(loaded) == set(names)
        for n in names:
            assert torch.equal(loaded[n], shard(n, sd[f"lm.{n}"], r, tp))
    if tp == 2:  # the two ranks hold different halves of a column-parallel weight
        q = "model.layers.0.self_attn.q_proj.weight"
        a, b = (w.model_runner.model.loaded[q] for w in llm.workers)
        assert torch.equal(torch.cat([a, b]), sd[f"lm.{q}"])
    assert llm.shut_down and eng.llm is None


def test_update_that_misses_a_rank_is_an_error(tiny):
    model, _ = tiny
    names = [n for n, _ in model.named_parameters()]
    eng = _engine(FakeLLM(2, names, drop_rank=1), 2)
    try:
        with pytest.raises(RpegError, match="reached 1 of 2 vLLM workers"):
            eng.update_weights(model.state_dict(), policy_version=1)
    finally:
        eng.shutdown()
    assert eng.policy_version == 0


def test_a_worker_failing_mid_update_is_raised_not_waited_for(tiny):
    """A worker that stops receiving (its loader failed on the first bucket) must not leave
    the sender in the next broadcast until the group's timeout."""
    import time

    model, _ = tiny
    names = [n for n, _ in model.named_parameters()]
    llm = FakeLLM(1, names, fail_on=names[0])
    eng = _engine(llm, 1, bucket_bytes=4096)
    t0 = time.monotonic()
    try:
        with pytest.raises(RpegError, match="cannot load weight"):
            eng.update_weights(model.state_dict(), policy_version=1)
    finally:
        eng.shutdown()
    assert time.monotonic() - t0 < 30 and eng.policy_version == 0


def test_requests_carry_each_samples_seed_and_cap():
    llm = FakeLLM(1, [])
    eng = _engine(llm, 1, processed_logprobs=True)
    p = SamplingParams(max_new_tokens=8, temperature=0.7, stop_token_ids=(5,))
    out = eng.generate([[3, 4], [9]], p, seed=100, max_new_tokens=[2, 5])
    _, prompts, params = llm.calls[-1]
    assert prompts == [{"prompt_token_ids": [3, 4]}, {"prompt_token_ids": [9]}]
    assert [sp["seed"] for sp in params] == [100, 101]
    assert [sp["max_tokens"] for sp in params] == [2, 5]
    for sp in params:
        assert sp["stop_token_ids"] == [2, 5]  # EOS and the stop token
        assert sp["logprobs"] == 0 and sp["detokenize"] is False and sp["top_k"] == -1
        assert sp["temperature"] == 0.7
    # fake: tokens last+1, last+2, ... capped at min(cap, 3); log-probs -0.5, -1.0, -1.5
    assert out.response_ids.tolist() == [[5, 6, 0], [10, 11, 12]]
    assert out.lengths.tolist() == [2, 3]
    assert out.logprobs.tolist() == [[-0.5, -1.0, 0.0], [-0.5, -1.0, -1.5]]
    assert out.finished.tolist() == [False, False]
    assert out.logprobs_exact
    unseeded = eng.generate([[3]], p)
    assert llm.calls[-1][2][0]["seed"] is None and unseeded.lengths.tolist() == [3]
    # one seed per row (a multi-turn rollout's later turns): each request gets its own
    eng.generate([[3], [9]], p, seed=[7, 2**55 + 7])
    assert [sp["seed"] for sp in llm.calls[-1][2]] == [7, 36028797018963975]
    with pytest.raises(RpegError, match="2 response caps for 1 prompts"):
        eng.generate([[3]], p, max_new_tokens=[1, 2])


def test_output_conversion_marks_stops_and_pads():
    def out(toks, reason):
        lps = [{t: SimpleNamespace(logprob=float(-t))} for t in toks]
        return SimpleNamespace(
            outputs=[SimpleNamespace(token_ids=toks, logprobs=lps, finish_reason=reason)]
        )

    o = to_generation_output([out([7, 2], "stop"), out([], "length")], 0, 3, logprobs_exact=False)
    assert o.response_ids.tolist() == [[7, 2], [0, 0]]
    assert o.logprobs.tolist() == [[-7.0, -2.0], [0.0, 0.0]]
    assert o.finished.tolist() == [True, False] and o.lengths.tolist() == [2, 0]
    assert o.policy_version == 3 and not o.logprobs_exact
    assert o.mask.tolist() == [[1, 1], [0, 0]]


def test_sampling_kwargs_keep_topk_and_topp():
    kw = sampling_kwargs(SamplingParams(top_k=20, top_p=0.9), cap=4, seed=1, stop_ids=[2])
    assert kw["top_k"] == 20 and kw["top_p"] == 0.9 and kw["max_tokens"] == 4


def test_logprobs_are_exact_only_untruncated_in_processed_mode():
    eng = _engine(FakeLLM(1, []), 1, processed_logprobs=True)
    assert eng.logprobs_exact(SamplingParams(temperature=1.3))
    assert eng.logprobs_exact(SamplingParams(temperature=0.0, top_k=5))  # greedy: argmax
    assert not eng.logprobs_exact(SamplingParams(top_p=0.95))
    assert not eng.logprobs_exact(SamplingParams(top_k=50))
    raw = _engine(FakeLLM(1, []), 1, processed_logprobs=False)
    assert not raw.logprobs_exact(SamplingParams())


def test_sleep_then_update_wakes_weights_only_and_generate_the_rest(tiny):
    model, _ = tiny
    names = [n for n, _ in model.named_parameters()]
    llm = FakeLLM(1, names, enable_sleep_mode=True)
    eng = _engine(llm, 1, sleep_mode=True)
    eng.sleep()
    eng.sleep()  # already asleep: one call
    try:
        eng.update_weights(model.state_dict(), policy_version=1)
    finally:
        eng.shutdown()
    eng.llm = llm  # (shut down: the fake still answers generate)
    eng.generate([[3]], SamplingParams(max_new_tokens=1))
    eng.wake_up()  # awake: no call
    kinds = [c[:2] for c in llm.calls if c[0] in ("sleep", "wake_up", "generate")]
    assert kinds == [
        ("sleep", 1),
        ("wake_up", ("weights",)),
        ("wake_up", ("kv_cache",)),
        ("generate", [{"prompt_token_ids": [3]}]),
    ]
    awake = FakeLLM(1, [])
    _engine(awake, 1).sleep()  # no sleep mode (a CPU platform): stays awake, no call
    assert awake.calls == []


def test_refresh_engine_after_a_weight_receive(tiny):
    from rpeg.runtime.engines.base import refresh_engine
    from rpeg.runtime.engines.torch_engine import TorchEngine

    model, tok = tiny
    shared = TorchEngine(model, tok.pad_token_id, tok.eos_token_id)
    refresh_engine(shared, model, {}, 4)  # generates with the role's module: version only
    assert shared.policy_version == 4
    names = [n for n, _ in model.named_parameters()]
    llm = FakeLLM(1, names)
    own = _engine(llm, 1)
    try:
        refresh_engine(own, model, model.state_dict(), 5)  # its own weights: loads them
    finally:
        own.shutdown()
    assert own.policy_version == 5
    assert set(llm.workers[0].model_runner.model.loaded) == set(names)


def test_the_plans_memory_share_reaches_the_vllm_engine(tiny, monkeypatch):
    """gpu_memory_utilization and enforce_eager come from the plan's generate unit (compiled
    into the group), the engine's dtype from the policy's precision, sleep mode from
    colocation; enforce_eager false leaves vLLM its own (CUDA graphs on GPUs)."""
    from rpeg.compile import compile_plan
    from rpeg.runtime.engines import choice
    from rpeg.runtime.engines.vllm import VLLMEngine

    cfg = RunConfig().with_overrides(
        {
            "cluster.n_workers": 1,
            "cluster.num_devices": 1,
            "plan": {
                "cluster": "local-cpu",
                "model": "rpeg-tiny",
                "graph": {"builder": None},
                "units": {
                    u: {
                        "devices": "0",
                        **(
                            {"gpu_memory_utilization": 0.3, "enforce_eager": True}
                            if u == "generate"
                            else {}
                        ),
                    }
                    for u in (
                        "generate",
                        "reward",
                        "ref_logprob",
                        "old_logprob",
                        "advantage",
                        "train_actor",
                        "sync_weights",
                    )
                },
            },
        }
    )
    (group,) = [g for g in compile_plan(None, cfg).actor_groups if "generate" in g.units]
    assert group.gen_memory_utilization == 0.3 and group.gen_enforce_eager is True
    others = [g for g in compile_plan(None, cfg).actor_groups if "generate" not in g.units]
    assert all(g.gen_enforce_eager is False for g in others)
    # the flag on a unit without an engine is refused by name, before anything starts
    bad = cfg.with_overrides({"plan.units.train_actor.enforce_eager": True})
    with pytest.raises(ConfigError, match=r"plan\.units\.train_actor\.enforce_eager"):
        compile_plan(None, bad)
    got = {}
    monkeypatch.setattr(VLLMEngine, "from_model", classmethod(lambda cls, m, **kw: got.update(kw)))
    model, tok = tiny
    choice.build_engine("vllm", model, tok, config=cfg, colocated=True, gpu_memory_utilization=0.3)
    assert got["gpu_memory_utilization"] == 0.3 and got["sleep_mode"] is True
    assert got["dtype"] == "float32"  # an fp32 policy's engine (was bf16: 1.4e-2 off)
    assert "enforce_eager" not in got
    choice.build_engine("vllm", model, tok, config=cfg, colocated=False, enforce_eager=True)
    assert got["enforce_eager"] is True
    got.clear()
    choice.build_engine("vllm", model, tok, config=cfg, colocated=False)
    assert got["gpu_memory_utilization"] == 0.8 and got["sleep_mode"] is False  # schema default
    assert "enforce_eager" not in got
    bf16 = cfg.with_overrides({"workload.precision": "bf16"})
    choice.build_engine("vllm", model, tok, config=bf16, colocated=False)
    assert got["dtype"] == "bfloat16"


def test_a_ranks_roles_build_their_vllm_engine_with_the_groups_enforce_eager(monkeypatch):
    """build_roles (a rank's models, the local trainer) hands ``engine_eager`` to the
    engine it builds, and leaves it off by default."""
    from rpeg.runtime import role_builder

    seen = []
    monkeypatch.setattr(
        role_builder, "build_engine", lambda *a, **kw: seen.append(kw.get("enforce_eager"))
    )
    cfg = RunConfig()
    role_builder.build_roles(cfg, ["actor"], engine="vllm", colocated=False, engine_eager=True)
    role_builder.build_roles(cfg, ["actor"], engine="vllm", colocated=False)
    assert seen == [True, False]
