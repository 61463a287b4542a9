"""The training-state memory terms against torch's own trackers on a real HF model class
under FakeTensorMode (no memory is allocated): ``MemTracker`` at one rank (dp = 1) and
``FSDPMemTracker`` for a layout the plan shards, FSDP2 ``fully_shard`` over a fake process group
of 4 ranks (``torch.testing._internal.distributed.fake_pg``: collectives return at once).

The model prices Megatron-style mixed precision: bf16 weights (2 B) + bf16 gradients (2 B) +
fp32 master weights and Adam moments (12 B) = 16 B per parameter. Plain fp32 AdamW, which
MemTracker sees here, keeps fp32 weights (4 B) + fp32 gradients (4 B) + two fp32 moments (8 B):
the same 16 B per parameter in another split, so the totals must agree (tolerance 0.5%: the
tracker's allocator rounding). This checks the parameter count torch sees (tied embeddings,
biases, norms) and the optimizer-state multiplicity, at the real width of Qwen2.5-0.5B (2 of its
24 layers, to stay fast). Activation memory is not compared: the model's constant is the
Megatron one (34 B per hidden unit per token per layer, Korthikanti et al. 2022) for fused
kernels, which the eager HF module does not use.
"""

import contextlib

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

from rpeg.ir import builders  # noqa: E402
from rpeg.perf import Workload, predict  # noqa: E402
from rpeg.plan import UnitPlan, colocated_plan  # noqa: E402
from tests.perf.hf_configs import (  # noqa: E402
    catalog_spec,
    deepseek_v3_small,
    qwen3_moe_small,
    qwen25_05b_two_layers,
)


def test_training_state_matches_memtracker():
    cfg = qwen25_05b_two_layers()
    with FakeTensorMode():
        model = transformers.Qwen2ForCausalLM(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        ids = torch.zeros(1, 128, dtype=torch.long)
        mt = MemTracker()
        mt.track_external(model, opt)
        with mt:
            model(input_ids=ids).logits.float().sum().backward()
            opt.step()
        snap = next(iter(mt.get_tracker_snapshot("current").values()))
    by = {str(k).split(".")[-1]: v for k, v in snap.items()}
    torch_state = by["PARAM"] + by["GRAD"] + by["OPT"]

    spec = catalog_spec(cfg, "q")
    g = builders.build("grpo", use_reference=False)
    plan = colocated_plan(g, "dgx-h100", num_devices=1, model="qwen2.5-0.5b-instruct")
    wl = Workload(
        num_prompts=1,
        samples_per_prompt=1,
        mean_prompt_tokens=64,
        max_response_tokens=64,
        mean_response_tokens=32,
        train_minibatches=1,
    )
    pred = predict(g, plan, wl, model=spec, check_memory=False)
    mem = pred.stages["train_actor"].memory_gb
    ours = (mem["weights"] + mem["gradients"] + mem["optimizer"]) * 1e9
    assert ours == pytest.approx(torch_state, rel=5e-3)


# (config, model class, fake tensors?): MoE routing is data-dependent (``nonzero``), which
# FakeTensorMode refuses, so the small MoE configs run on real tensors (a few MB)
FAMILIES = {
    "dense-gqa": (qwen25_05b_two_layers, "Qwen2ForCausalLM", True),
    "moe": (qwen3_moe_small, "Qwen3MoeForCausalLM", False),
    "mla-moe": (deepseek_v3_small, "DeepseekV3ForCausalLM", False),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fsdp_sharded_training_state_matches_fsdpmemtracker(family):
    """fsdp dp=4: weights, gradients and optimizer state are all 1/4 per rank (FSDP2 shards
    each parameter's dim 0, padded to a multiple of 4). The tracker's per-rank bytes and the
    model's ``weights + gradients + optimizer`` of the plan's fsdp unit agree within 0.5%, for
    each architecture family of the catalog (dense GQA, MoE, MLA + MoE with a dense first layer):
    a miss is a parameter-count or sharding formula, not a constant."""
    import torch.distributed as dist
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dp = 4
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    make_config, cls, fake = FAMILIES[family]
    cfg = make_config()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=dp)
    try:
        mesh = init_device_mesh("cpu", (dp,))
        with FakeTensorMode() if fake else contextlib.nullcontext():
            model = getattr(transformers, cls)(cfg)
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
            ids = torch.zeros(1, 128, dtype=torch.long)
            mt = FSDPMemTracker(model, opt)
            mt.track_inputs((ids,))
            with mt:
                model(input_ids=ids).logits.float().sum().backward()
                opt.step()
            snap = next(iter(mt.get_tracker_snapshot("current").values()))
    finally:
        dist.destroy_process_group()
    by = {str(k).split(".")[-1]: v for k, v in snap.items()}
    assert by["UNSHARDED_PARAM"] == 0 and by["UNSHARDED_GRAD"] == 0  # resharded after use
    torch_state = by["SHARDED_PARAM"] + by["SHARDED_GRAD"] + by["OPT"]

    spec = catalog_spec(cfg, "q")
    g = builders.build("grpo", use_reference=False)
    plan = colocated_plan(g, "dgx-h100", num_devices=dp, model="qwen2.5-0.5b-instruct")
    units = {
        n: UnitPlan(**{**u.model_dump(), "engine": "fsdp"}) if n == "train_actor" else u
        for n, u in plan.units.items()
    }
    plan = plan.model_copy(update={"units": units})
    wl = Workload(
        num_prompts=dp,
        samples_per_prompt=1,
        mean_prompt_tokens=64,
        max_response_tokens=64,
        mean_response_tokens=32,
        train_minibatches=1,
    )
    pred = predict(g, plan, wl, model=spec, check_memory=False)
    mem = pred.stages["train_actor"].memory_gb
    ours = (mem["weights"] + mem["gradients"] + mem["optimizer"]) * 1e9
    assert ours == pytest.approx(torch_state, rel=5e-3)
