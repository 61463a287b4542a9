"""The vLLM engine for real (CUDA + vllm): greedy tokens and log-probs against the torch
engine on the same weights, a weight update through collective_rpc, and sleep/wake_up.

Skipped, saying which is missing, where CUDA or vllm is absent (vllm is the ``gpu`` extra;
CI machines are CPU-only). The reference is the project's own TorchEngine on the same model,
which tests/runtime/test_engine.py checks against a plain forward pass."""

from __future__ import annotations

import importlib.util

import pytest
import torch

_REASONS = [
    r
    for r, missing in (
        ("no CUDA device", not torch.cuda.is_available()),
        (
            "vllm is not installed (pip install 'rpeg[gpu]')",
            importlib.util.find_spec("vllm") is None,
        ),
    )
    if missing
]

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(bool(_REASONS), reason="; ".join(_REASONS) or "ok"),
]


@pytest.fixture(scope="module")
def engines():
    from rpeg.runtime.engines.torch_engine import TorchEngine
    from rpeg.runtime.engines.vllm import VLLMEngine
    from rpeg.runtime.model_io import create_tiny

    model, tok = create_tiny(seed=0)
    ref = TorchEngine(model.to("cuda"), tok.pad_token_id, tok.eos_token_id)
    eng = VLLMEngine.from_model(
        model,
        pad_id=tok.pad_token_id,
        eos_id=tok.eos_token_id,
        dtype="float32",
        gpu_memory_utilization=0.2,
        sleep_mode=True,
        enforce_eager=True,
        max_model_len=256,
    )
    return model, tok, ref, eng


def _prompts(tok):
    return [tok("12+7=")["input_ids"], tok("3*4=")["input_ids"]]


def _same(ref_out, out, atol=2e-3):
    assert out.response_ids.tolist() == ref_out.response_ids.tolist()
    assert out.lengths.tolist() == ref_out.lengths.tolist()
    assert torch.allclose(out.logprobs, ref_out.logprobs, atol=atol)


def test_greedy_tokens_and_logprobs_match_the_torch_engine(engines):
    from rpeg.runtime.engines.base import SamplingParams

    _, tok, ref, eng = engines
    p = SamplingParams(max_new_tokens=12, temperature=0.0)
    out = eng.generate(_prompts(tok), p)
    assert eng.processed_logprobs, "this vLLM lacks logprobs_mode: log-probs are recomputed"
    assert out.logprobs_exact
    _same(ref.generate(_prompts(tok), p), out)


def test_weight_update_reaches_the_workers(engines):
    from rpeg.runtime.engines.base import SamplingParams

    model, tok, ref, eng = engines
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(0.05 * torch.randn_like(prm))
    eng.update_weights({k: v.detach().cpu() for k, v in model.state_dict().items()}, 1)
    p = SamplingParams(max_new_tokens=12, temperature=0.0)
    _same(ref.generate(_prompts(tok), p), eng.generate(_prompts(tok), p))
    assert eng.policy_version == 1


def test_sleep_update_and_wake_for_colocated_plans(engines):
    from rpeg.runtime.engines.base import SamplingParams

    model, tok, ref, eng = engines
    free0 = torch.cuda.mem_get_info()[0]
    eng.sleep(level=1)
    assert torch.cuda.mem_get_info()[0] > free0  # weights and KV cache released
    with torch.no_grad():
        for prm in model.parameters():
            prm.mul_(0.9)
    eng.update_weights({k: v.detach().cpu() for k, v in model.state_dict().items()}, 2)
    p = SamplingParams(max_new_tokens=8, temperature=0.0)
    _same(ref.generate(_prompts(tok), p), eng.generate(_prompts(tok), p))  # wakes the rest
    assert not eng.asleep


def test_seeded_sampling_is_reproducible_per_sample(engines):
    from rpeg.runtime.engines.base import SamplingParams

    _, tok, _, eng = engines
    p = SamplingParams(max_new_tokens=10, temperature=1.0)
    a = eng.generate(_prompts(tok), p, seed=5, max_new_tokens=[3, 10])
    b = eng.generate(_prompts(tok), p, seed=5, max_new_tokens=[3, 10])
    assert a.response_ids.tolist() == b.response_ids.tolist()
    assert int(a.lengths[0]) <= 3


def test_the_residency_releases_the_device_after_a_rollout_and_wakes_in_order(engines):
    """rpeg.runtime.engines.residency as the runtimes call it: after_rollout frees device
    memory (vLLM's engine core is another process: measured as the device's free bytes);
    before_update brings back the weights only, after_update the KV cache."""
    from rpeg.runtime.engines.base import SamplingParams
    from rpeg.runtime.engines.residency import EngineResidency

    _, tok, _, eng = engines
    res = EngineResidency(eng, colocated=True)
    assert res.active
    eng.generate(_prompts(tok), SamplingParams(max_new_tokens=4, temperature=0.0))
    awake = torch.cuda.mem_get_info()[0]
    res.after_rollout()
    asleep = torch.cuda.mem_get_info()[0]
    res.before_update()
    weights_only = torch.cuda.mem_get_info()[0]
    res.after_update()
    woken = torch.cuda.mem_get_info()[0]
    assert asleep > awake  # weights offloaded and KV cache freed while the trainer runs
    assert asleep > weights_only > woken  # the weights came back first, the KV cache last
    assert not eng.asleep


# --------------------------------------------------------------------------- CUDA transports
def _open_in_another_process(wire, out):
    """A spawned process's view of a shared bucket (what a vLLM worker does)."""
    from rpeg.runtime.engines.vllm_cuda_transfer import IpcBucket, rebuild_bucket

    flat = rebuild_bucket(IpcBucket.from_wire(wire), torch.device("cuda", 0))
    out.put(flat.cpu().tolist())


def test_a_bucket_shared_by_cuda_ipc_opens_in_another_process():
    import torch.multiprocessing as mp

    from rpeg.runtime.engines.vllm_cuda_transfer import share_bucket
    from rpeg.runtime.engines.vllm_transfer import pack_bucket, plan_buckets

    tensors = {"a": torch.arange(6.0).view(2, 3), "b": torch.tensor([-1.5, 2.25])}
    (plan,) = plan_buckets(list(tensors.items()), 1 << 20)
    flat = pack_bucket(plan, tensors, torch.device("cuda", 0))
    torch.cuda.synchronize()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_open_in_another_process, args=(share_bucket(plan, flat).to_wire(), out))
    p.start()
    got = out.get(timeout=120)
    p.join(60)
    # a at 0..5, b at 16..17 (offsets aligned to 16 elements), zero padding between
    assert got[:6] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and got[16:18] == [-1.5, 2.25]
    assert p.exitcode == 0


def _fresh_engine(model, tok):
    from rpeg.runtime.engines.vllm import VLLMEngine

    return VLLMEngine.from_model(
        model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, dtype="float32",
        gpu_memory_utilization=0.15, enforce_eager=True, max_model_len=256,
    )  # fmt: skip


def test_a_colocated_engine_is_refit_through_cuda_ipc(engines):
    """Weights on the engine's own GPU (a colocated trainer): the update shares CUDA IPC
    handles (no host copy, no process group) and the engine then generates as the torch
    engine on the same weights."""
    from rpeg.runtime.engines.base import SamplingParams

    model, tok, ref, _ = engines
    eng = _fresh_engine(model, tok)
    try:
        with torch.no_grad():
            for prm in model.parameters():
                prm.add_(0.03 * torch.randn_like(prm))
        eng.update_weights({k: v.detach() for k, v in model.state_dict().items()}, 5)
        assert eng.transport == "cuda_ipc" and eng._group is None
        p = SamplingParams(max_new_tokens=12, temperature=0.0)
        _same(ref.generate(_prompts(tok), p), eng.generate(_prompts(tok), p))
    finally:
        eng.shutdown()


def test_a_colocated_trainer_refits_its_engine_from_device_memory(engines):
    """The runtime's colocated refit (``load_engine_from_actor``: the trainer's weights
    streamed from its ``weight_source``, never ``get_weights``' host copy) takes the CUDA IPC
    path, and the engine then generates as the torch engine on the same weights."""
    from types import SimpleNamespace

    from rpeg.runtime.actors.weight_sync import load_engine_from_actor
    from rpeg.runtime.engines.base import SamplingParams
    from rpeg.runtime.sharding import full_tensor_source

    model, tok, ref, _ = engines
    eng = _fresh_engine(model, tok)
    try:
        with torch.no_grad():
            for prm in model.parameters():
                prm.add_(0.03 * torch.randn_like(prm))
        actor = SimpleNamespace(
            weight_source=lambda: full_tensor_source(model, torch.float32),
            policy_version=9,
            device=next(model.parameters()).device,
        )
        load_engine_from_actor(eng, actor)
        assert eng.transport == "cuda_ipc" and eng._group is None and eng.policy_version == 9
        p = SamplingParams(max_new_tokens=12, temperature=0.0)
        _same(ref.generate(_prompts(tok), p), eng.generate(_prompts(tok), p))
    finally:
        eng.shutdown()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL refit needs two GPUs")
def test_an_engine_on_another_gpu_is_refit_through_nccl(engines):
    """Weights on GPU 1, the engine's worker on GPU 0: one NCCL group of the two."""
    from rpeg.runtime.engines.base import SamplingParams

    model, tok, ref, _ = engines
    eng = _fresh_engine(model, tok)
    try:
        with torch.no_grad():
            for prm in model.parameters():
                prm.mul_(1.02)
        sd = {k: v.detach().to("cuda:1") for k, v in model.state_dict().items()}
        eng.update_weights(sd, 6)
        eng.update_weights(sd, 7)  # the group is set up once
        assert eng.transport == "nccl" and eng.last_update.buckets >= 1
        p = SamplingParams(max_new_tokens=12, temperature=0.0)
        _same(ref.generate(_prompts(tok), p), eng.generate(_prompts(tok), p))
    finally:
        eng.shutdown()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="engine placement needs two GPUs")
def test_an_engine_built_from_a_model_on_gpu_1_runs_on_gpu_1(engines):
    """Plain Dask workers see every GPU: a rank training on cuda:1 gets its vLLM on cuda:1
    (vllm_placement), so its refit takes CUDA IPC, not NCCL to an engine on GPU 0."""
    import copy

    from rpeg.runtime.engines.base import SamplingParams
    from rpeg.runtime.engines.vllm_cuda_transfer import device_id, worker_devices

    model, tok, ref, _ = engines
    on1 = copy.deepcopy(model).to("cuda:1")
    eng = _fresh_engine(on1, tok)
    try:
        workers = worker_devices(eng.llm, 120.0)
        assert [w.uuid for w in workers] == [device_id(torch.device("cuda", 1)).uuid]
        eng.update_weights({k: v.detach() for k, v in on1.state_dict().items()}, 8)
        assert eng.transport == "cuda_ipc"
        p = SamplingParams(max_new_tokens=12, temperature=0.0)
        _same(ref.generate(_prompts(tok), p), eng.generate(_prompts(tok), p))
    finally:
        eng.shutdown()
