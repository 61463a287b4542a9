"""The vLLM engine without vLLM: HF weight names, requests, output conversion, the weight
update protocol over a fake ``LLM`` with several tensor-parallel workers, sleep/wake, and the
choice of engine from config and plan. (tests/runtime/test_vllm_gpu.py runs the real thing.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rpeg.config import RunConfig
from rpeg.errors import ConfigError, RpegError
from rpeg.runtime.engines.base import SamplingParams
from rpeg.runtime.engines.choice import (
    check_engine,
    declared_engine,
    logprob_problems,
    resolve_engine,
)
from rpeg.runtime.engines.vllm import (
    VLLMEngine,
    WeightLoaderExtension,
    hf_weight_names,
    sampling_kwargs,
    to_generation_output,
    weight_buckets,
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


def test_weight_buckets_bound_the_bytes_in_flight():
    f = torch.zeros  # float32: 4 bytes an element
    named = [("a", f(10)), ("b", f(10)), ("c", f(30)), ("d", f(5))]
    got = [[n for n, _ in b] for b in weight_buckets(named, bucket_bytes=80)]
    assert got == [["a", "b"], ["c"], ["d"]]  # 40+40; 120 alone (over the cap); 20
    assert [[n for n, _ in b] for b in weight_buckets(named, bucket_bytes=10**6)] == [
        ["a", "b", "c", "d"]
    ]


# --------------------------------------------------------------------------- a fake vLLM
_COL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens")  # split rows
_ROW = ("o_proj", "down_proj")  # split columns


def _shard(name: str, full: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    if any(k in name for k in _COL):
        return full.chunk(tp, dim=0)[rank]
    if any(k in name for k in _ROW):
        return full.chunk(tp, dim=1)[rank]
    return full


class FakeShardModel(torch.nn.Module):
    """One tensor-parallel rank's model, loading full HF tensors as vLLM's loaders do: each
    rank keeps its slice (rows of column-parallel layers, columns of row-parallel ones)."""

    def __init__(self, rank: int, tp: int, names: list[str]):
        super().__init__()
        self.rank, self.tp = rank, tp
        self.loaded: dict[str, torch.Tensor] = {}
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.names = set(names)

    def load_weights(self, weights):
        for name, full in weights:
            assert name in self.names, f"rank {self.rank}: unknown weight {name}"
            self.loaded[name] = _shard(name, full, self.rank, self.tp).clone()
        return set(self.loaded)


class FakeWorker(WeightLoaderExtension):
    def __init__(self, model):
        self.model_runner = SimpleNamespace(model=model)


class FakeLLM:
    """The methods of ``vllm.LLM`` the engine calls, over ``tp`` fake workers."""

    def __init__(self, tp: int, names: list[str], *, drop_rank: int | None = None):
        self.workers = [FakeWorker(FakeShardModel(r, tp, names)) for r in range(tp)]
        self.drop_rank = drop_rank
        self.calls: list[tuple] = []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        assert isinstance(method, str)  # by name: no pickled callables
        self.calls.append(("rpc", method, len(args[0])))
        return [
            getattr(w, method)(*args, **(kwargs or {}))
            for r, w in enumerate(self.workers)
            if r != self.drop_rank
        ]

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags) if tags else None))

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append(("generate", prompts, params))
        outs = []
        for p, sp in zip(prompts, params, strict=True):
            n = min(sp["max_tokens"], 3)
            toks = [p["prompt_token_ids"][-1] + 1 + j for j in range(n)]
            lps = [{t: SimpleNamespace(logprob=-0.5 * (j + 1))} for j, t in enumerate(toks)]
            c = SimpleNamespace(token_ids=toks, logprobs=lps, finish_reason="length")
            outs.append(SimpleNamespace(outputs=[c]))
        return outs


def _engine(llm, tp, **kw):
    return VLLMEngine(
        llm,
        pad_id=0,
        eos_id=2,
        tensor_parallel_size=tp,
        tie_word_embeddings=True,
        sampling_params_cls=dict,
        **kw,
    )


@pytest.mark.parametrize("tp", [1, 2])
def test_update_reaches_every_tp_rank_with_its_shard(tiny, tp):
    model, _ = tiny
    sd = {k: v.clone() + 1.0 for k, v in ActorCritic(model).state_dict().items()}
    names = [n for n, _ in model.named_parameters()]
    llm = FakeLLM(tp, names)
    eng = _engine(llm, tp, bucket_bytes=64 * 1024)
    eng.update_weights(sd, policy_version=7)
    assert eng.policy_version == 7
    rpcs = [c for c in llm.calls if c[0] == "rpc"]
    assert len(rpcs) > 1 and {c[1] for c in rpcs} == {"rpeg_load_weights"}  # bucketed
    assert sum(c[2] for c in rpcs) == len(names)
    assert llm.calls[-1] == ("reset_prefix_cache",)  # after the last bucket
    for r, w in enumerate(llm.workers):
        loaded = w.model_runner.model.loaded
        assert set(loaded) == set(names)
        for n in names:
            full = sd[f"lm.{n}"]
            assert torch.equal(loaded[n], _shard(n, full, r, tp))
    if tp == 2:  # the two ranks hold different halves of a column-parallel weight
        q = "model.layers.0.self_attn.q_proj.weight"
        a, b = (w.model_runner.model.loaded[q] for w in llm.workers)
        assert torch.equal(torch.cat([a, b]), sd[f"lm.{q}"])


def test_update_that_misses_a_rank_is_an_error(tiny):
    model, _ = tiny
    names = [n for n, _ in model.named_parameters()]
    eng = _engine(FakeLLM(2, names, drop_rank=1), 2)
    with pytest.raises(RpegError, match="reached 1 of 2 vLLM workers"):
        eng.update_weights(model.state_dict(), policy_version=1)
    assert eng.policy_version == 0


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
    llm = FakeLLM(1, names)
    eng = _engine(llm, 1, sleep_mode=True)
    eng.sleep()
    eng.sleep()  # already asleep: one call
    eng.update_weights(model.state_dict(), policy_version=1)
    eng.generate([[3]], SamplingParams(max_new_tokens=1))
    eng.wake_up()  # awake: no call
    kinds = [c[:2] for c in llm.calls if c[0] in ("sleep", "wake_up", "generate")]
    assert kinds == [
        ("sleep", 1),
        ("wake_up", ("weights",)),
        ("wake_up", ("kv_cache",)),
        ("generate", [{"prompt_token_ids": [3]}]),
    ]
    with pytest.raises(RpegError, match="without sleep mode"):
        _engine(FakeLLM(1, []), 1).sleep()


# --------------------------------------------------------------------------- the choice
def test_declared_engine_from_config_and_plan():
    assert declared_engine("auto", {"generate": "auto"}) == "auto"
    assert declared_engine("auto", {"rollout": "vllm"}) == "vllm"
    assert declared_engine("torch", {"generate": "auto"}) == "torch"
    assert declared_engine("vllm", {"generate": "vllm"}) == "vllm"
    with pytest.raises(ConfigError) as e:
        declared_engine("torch", {"generate": "vllm", "gen2": "sglang"})
    msgs = [str(p) for p in e.value.problems]
    assert any("plan.units.gen2.engine" in m and "sglang" in m for m in msgs)
    assert any("disagree" in m and "plan.units.generate.engine=vllm" in m for m in msgs)


@pytest.mark.parametrize(
    "declared,device,avail,tp,want",
    [
        ("auto", "cpu", True, 1, "torch"),
        ("auto", "cuda", False, 1, "torch"),
        ("auto", "cuda", True, 1, "vllm"),
        ("auto", "cuda", True, 2, "torch"),
        ("torch", "cuda", True, 1, "torch"),
        ("vllm", "cuda", True, 1, "vllm"),
    ],
)
def test_resolve_engine(declared, device, avail, tp, want):
    got = resolve_engine(declared, device_type=device, gen_tp=tp, vllm_available=avail)
    assert got == want


def test_explicit_vllm_without_cuda_or_package_lists_both_problems():
    with pytest.raises(ConfigError) as e:
        resolve_engine("vllm", device_type="cpu", vllm_available=False)
    msgs = " | ".join(str(p) for p in e.value.problems)
    assert "needs CUDA" in msgs and "not installed" in msgs
    assert all(p.where == "runtime.engine" for p in e.value.problems)


def test_check_engine_before_start():
    from rpeg.compile import compile_plan

    cfg = RunConfig()
    assert check_engine(cfg, compile_plan(None, cfg)) == "torch"  # the CPU default
    cfg = RunConfig().with_overrides({"runtime.engine": "vllm"})
    with pytest.raises(ConfigError, match="runtime.engine"):
        check_engine(cfg, compile_plan(None, cfg))
    with pytest.raises(ConfigError, match="runtime.engine: got 'sglang'"):
        RunConfig().with_overrides({"runtime.engine": "sglang"})


def test_truncated_sampling_with_vllm_needs_recomputed_logprobs():
    cfg = RunConfig()
    w = cfg.workload
    a = cfg.algorithm
    assert logprob_problems("vllm", w, a) == []  # top_k 0, top_p 1: exact
    w2 = w.model_copy(update={"top_p": 0.9})
    (p,) = logprob_problems("vllm", w2, a)
    assert p.where == "algorithm.recompute_old_logprobs"
    assert logprob_problems("torch", w2, a) == []
    assert logprob_problems("vllm", w2, a.model_copy(update={"recompute_old_logprobs": True})) == []


def test_rank_engine_resolves_where_the_rank_runs(monkeypatch):
    from rpeg.runtime.engines import choice

    cfg = RunConfig()
    # a CPU rank never reads the plan (a path only the flow host may see)
    cfg_path_plan = cfg.model_copy(update={"plan": "/nonexistent/plan.yaml"})
    assert choice.rank_engine(cfg_path_plan, {"device_type": "cpu", "gen_tp": 1}) == "torch"
    monkeypatch.setattr(choice, "vllm_importable", lambda: True)
    assert choice.rank_engine(cfg, {"device_type": "cuda", "gen_tp": 1}) == "vllm"
    assert choice.rank_engine(cfg, {"device_type": "cuda", "gen_tp": 2}) == "torch"
    torch_cfg = cfg.with_overrides({"runtime.engine": "torch"})
    assert choice.rank_engine(torch_cfg, {"device_type": "cuda", "gen_tp": 1}) == "torch"
    monkeypatch.setattr(choice, "vllm_importable", lambda: False)
    assert choice.rank_engine(cfg, {"device_type": "cuda", "gen_tp": 1}) == "torch"
    with pytest.raises(ConfigError, match="not installed"):
        choice.rank_engine(
            cfg.with_overrides({"runtime.engine": "vllm"}), {"device_type": "cuda", "gen_tp": 1}
        )


def test_build_engine_torch_is_a_private_copy(tiny):
    from rpeg.runtime.engines.choice import build_engine
    from rpeg.runtime.engines.torch_engine import TorchEngine

    model, tok = tiny
    eng = build_engine("torch", model, tok, config=RunConfig(), colocated=True)
    assert isinstance(eng, TorchEngine) and eng.model is not model
    a, b = next(eng.model.parameters()), next(model.parameters())
    assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()


def test_local_trainer_refuses_vllm_on_cpu():
    from rpeg.runtime.local_trainer import LocalTrainer

    cfg = RunConfig().with_overrides({"runtime.engine": "vllm", "optim.warmup_sft_steps": 0})
    with pytest.raises(ConfigError, match="vllm needs CUDA devices"):
        LocalTrainer(cfg)


def test_engine_problems_lists_what_check_engine_raises():
    from rpeg.compile import compile_plan
    from rpeg.runtime.engines.choice import engine_problems

    ok = RunConfig()
    assert engine_problems(ok, compile_plan(None, ok)) == []
    bad = RunConfig().with_overrides({"runtime.engine": "vllm"})
    got = engine_problems(bad, compile_plan(None, bad))
    assert got and all(p.where == "runtime.engine" for p in got)
    assert any("needs CUDA" in p.what for p in got)


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
    refresh_engine(own, model, model.state_dict(), 5)  # holds its own weights: loads them
    assert own.policy_version == 5
    assert set(llm.workers[0].model_runner.model.loaded) == set(names)
