"""What a plan unit says about memory is executed (rpeg.runtime.unit_memory): ``recompute``
checkpoints the decoder layers (same loss and gradients, fewer activations kept for
backward), ``offload`` moves a unit's roles to the host and back (on CPU a no-op that
runs), and the compiler resolves ``recompute: auto`` by the activations' share of a device."""

from __future__ import annotations

import pytest
import sharding_cases as C
import torch

from rpeg.config import RunConfig

UNITS = ("generate", "reward", "ref_logprob", "old_logprob", "advantage", "train_actor")


def _saved_activation_bytes(module, ids) -> int:
    """Bytes of the tensors a forward keeps for backward, the parameters left out (what
    activation memory is: torch.autograd.graph.saved_tensors_hooks)."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            kept[s.data_ptr()] = s.nbytes()
        return t

    module.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(input_ids=ids)
    module.eval()
    return sum(kept.values())


def test_recompute_gives_the_same_step_with_fewer_activations_kept():
    from rpeg.runtime.unit_memory import apply_recompute, recomputes

    cfg = C.config()
    runs = {}
    for rec in (False, True):
        m, tok = C.model()
        w = C.policy(cfg, m, tok)
        if rec:
            assert apply_recompute(w.module) and recomputes(w.module)
        ids = torch.randint(3, 90, (4, 12), generator=torch.Generator().manual_seed(0))
        kept = _saved_activation_bytes(w.lm, ids)
        metrics = w.train_step(C.with_old_logprobs(C.batch(0), w))
        runs[rec] = (metrics, {k: v.clone() for k, v in w.module.state_dict().items()}, kept)
    (m0, w0, kept0), (m1, w1, kept1) = runs[False], runs[True]
    for key in ("pg_loss", "kl", "entropy", "grad_norm"):
        assert m1[key] == pytest.approx(m0[key], abs=1e-5), key
    for k, v in w0.items():
        torch.testing.assert_close(w1[k], v, atol=1e-5, rtol=0, msg=k)
    assert kept1 < 0.5 * kept0  # a layer's input per layer, not all its activations


def test_offloader_moves_a_units_roles_and_brings_them_back():
    from rpeg.runtime.unit_memory import Offloader

    m, tok = C.model()
    w = C.policy(C.config(), m, tok)
    ref = C.policy(C.config(), C.model()[0], tok, trainable=False)
    w.train_step(C.with_old_logprobs(C.batch(0), w))  # optimizer state exists
    before = {k: v.clone() for k, v in w.module.state_dict().items()}
    off = Offloader({"actor": w, "reference": ref}, torch.device("cpu"))
    off.after(["ref_logprob"], offload=False)  # a unit without offload moves nothing
    assert off.moves == 0 and not off.on_host
    off.after(["train_actor"], offload=True)
    assert off.on_host == {"actor"} and off.moves == 1
    off.before(["ref_logprob"])  # the reference was never moved: nothing comes back
    assert off.on_host == {"actor"}
    off.before(["generate"])  # generation computes with the actor: back it comes
    assert not off.on_host and off.moves == 2
    off.after(["ref_logprob", "old_logprob"], offload=True)
    off.restore_all()
    assert not off.on_host and off.moves == 6
    after = w.module.state_dict()
    for k, v in before.items():
        assert torch.equal(after[k], v), k
    state = next(iter(w.optimizer.state.values()))
    assert state["exp_avg"].device.type == "cpu"


def _cfg(**unit) -> RunConfig:
    units = {u: {"devices": "0"} for u in (*UNITS, "sync_weights")}
    for name in ("ref_logprob", "train_actor"):
        units[name].update(unit)
    return RunConfig().with_overrides(
        {
            "optim.warmup_sft_steps": 0,
            "workload.num_prompts": 4,
            "workload.samples_per_prompt": 4,
            "workload.max_response_tokens": 4,
            "cluster.n_workers": 1,
            "cluster.num_devices": 1,
            "plan": {
                "cluster": "local-cpu",
                "model": "rpeg-tiny",
                "staleness": 0,
                "graph": {"builder": None},
                "units": units,
            },
        }
    )


def test_the_local_trainer_honours_recompute_and_offload():
    """The same step with both on: the plan's fields reach the roles (layers checkpointed,
    roles moved), and the metrics equal the plain step's."""
    from rpeg.runtime.local_trainer import LocalTrainer
    from rpeg.runtime.unit_memory import recomputes

    plain = LocalTrainer(_cfg(recompute=False, offload=False))
    both = LocalTrainer(_cfg(recompute=True, offload=True))
    assert not recomputes(plain.actor.module) and recomputes(both.actor.module)
    assert [t.offload for t in both.compiled.tasks if t.name in ("ref_logprob", "train_actor")] == [
        True,
        True,
    ]
    a, b = plain.step(), both.step()
    assert both.offloader.moves >= 4  # out after each offloaded unit, back before the next use
    assert not both.offloader.on_host  # resident between steps
    for key in ("pg_loss", "grad_norm", "reward_mean"):
        assert b[key] == pytest.approx(a[key], abs=1e-5), key


def test_recompute_auto_follows_the_activations_share_of_a_device():
    from rpeg.compile import compile_step

    def group(cfg):
        return compile_step(None, cfg).actor_groups[0]

    base = _cfg()
    assert group(base).recompute is False  # rpeg-tiny: a few MB of activations
    assert group(_cfg(recompute=True)).recompute is True
    # a wide built-in model and a micro-batch whose activations pass 25% of the 8 GB CPU
    # device: 512 samples x 48 tokens x 8 layers x 4 B x (10 x 1536 + 4 x 6144) ~ 31 GB
    wide = base.with_overrides(
        {
            "model.tiny_shape": {
                "hidden_size": 1536,
                "intermediate_size": 6144,
                "num_hidden_layers": 8,
                "num_attention_heads": 12,
                "num_key_value_heads": 12,
            },
            "workload.num_prompts": 64,
            "workload.samples_per_prompt": 8,
            "plan.units.train_actor.micro_batch_size": 512,
        }
    )
    assert group(wide).recompute is True
    assert (
        group(wide.with_overrides({"plan.units.train_actor.recompute": False})).recompute is False
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_offload_frees_and_restores_device_memory_on_cuda():
    """On a GPU the offload is real: the trained actor's weights, gradients-free state and
    AdamW moments leave the device (allocated bytes drop by about 16 B a parameter) and come
    back bit-exact. CPU rehearsal: test_offloader_moves_a_units_roles_and_brings_them_back."""
    from rpeg.runtime.unit_memory import Offloader

    cuda = torch.device("cuda", 0)
    m, tok = C.model()
    w = C.policy(C.config(), m.to(cuda), tok)
    w.train_step(C.with_old_logprobs(C.batch(0), w))
    params = sum(p.numel() for p in w.module.parameters())
    before = {k: v.detach().cpu().clone() for k, v in w.module.state_dict().items()}
    torch.cuda.synchronize()
    on = torch.cuda.memory_allocated(cuda)
    off = Offloader({"actor": w}, cuda)
    off.after(["train_actor"], offload=True)
    assert on - torch.cuda.memory_allocated(cuda) >= 0.9 * 12 * params  # weights + moments
    off.before(["generate"])
    assert torch.cuda.memory_allocated(cuda) >= on - 1024
    for k, v in w.module.state_dict().items():
        assert torch.equal(v.cpu(), before[k]), k
