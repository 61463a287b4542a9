"""`rpeg export` of a checkpoint whose policy is torch.distributed.checkpoint shards (a sharded
group's ``<step folder>/<group>.dcp``): read in one process with a metadata unpickler that
builds DCP's own classes only; a LoRA policy's shards give peft's adapter and the merged
model; a folder of neither format is a named error. The real 2-rank runs (LoRA at tp=2, full
weights at FSDP dp=2) are tests/runtime/actors/test_export_sharded_runs.py."""

import os
import pickle

import pytest
import torch

from rpeg.runtime.actors.checkpoint import CheckpointError

pytest.importorskip("peft")


class _Mkdir:
    """Pickles as a call of os.mkdir(path): what a crafted .metadata could run."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_the_metadata_unpickler_refuses_a_foreign_global_without_calling_it(tmp_path):
    from rpeg.runtime.actors.shard_reader import allowed_global, read_metadata

    target = tmp_path / "ran"
    bad = tmp_path / "bad.metadata"
    bad.write_bytes(pickle.dumps(_Mkdir(str(target))))
    with open(bad, "rb") as fh, pytest.raises(CheckpointError, match=r"\.mkdir.*not one of DCP"):
        read_metadata(fh, str(bad))
    assert not target.exists()  # never called
    # what a DCP metadata names is allowed; builtins' eval, os.system are not
    assert allowed_global("torch", "bfloat16") and allowed_global("torch", "Size")
    assert not allowed_global("torch", "load") and not allowed_global("builtins", "eval")
    # a plain pickle of something else than DCP metadata is refused too
    other = tmp_path / "list.metadata"
    other.write_bytes(pickle.dumps([1, 2]))
    with open(other, "rb") as fh, pytest.raises(CheckpointError, match="not DCP metadata"):
        read_metadata(fh, str(other))


def test_read_tensors_gives_whole_tensors_under_a_prefix_and_skips_values(tmp_path):
    """Shards written by save_shards (one process): the actor's two tensors come back whole,
    keyed without ``actor.model.``; the optimizer's state and the non-tensor extras (an int,
    whose read would unpickle) are not asked for."""
    from rpeg.runtime.actors.shard_checkpoint import save_shards
    from rpeg.runtime.actors.shard_reader import read_tensors

    lin = torch.nn.Linear(3, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
        lin.bias.copy_(torch.tensor([7.0, 8.0]))
    opt = torch.optim.AdamW(lin.parameters())
    url = str(tmp_path / "g.dcp")
    save_shards(url, {"actor": (lin, opt)}, {"policy_version": 3})
    got = read_tensors(url, "actor.model.")
    assert sorted(got) == ["bias", "weight"]
    assert got["weight"].tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    assert got["bias"].tolist() == [7.0, 8.0]
    assert read_tensors(url, "critic.model.") == {}
    with pytest.raises(CheckpointError, match="missing"):
        read_tensors(str(tmp_path), "actor.model.")


def _lora_cfg(tmp_path, **over):
    from rpeg.config import RunConfig

    base = {
        "model.tiny_shape": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2},
        "model.lora": {"rank": 4, "alpha": 8},
        "optim.warmup_sft_steps": 0,
        "runtime.output_dir": str(tmp_path / "out"),
    }
    return RunConfig().with_overrides({**base, **over})


def _sharded_checkpoint(tmp_path, cfg, worker) -> str:
    """A step folder as a sharded group writes it: a light rank part and the group's DCP
    shards (here written by one process), the commit marker with ``sharded_groups``."""
    from rpeg.runtime.actors.checkpoint import CheckpointStore, rank_state_bytes
    from rpeg.runtime.actors.checkpoint_identity import model_identity
    from rpeg.runtime.actors.shard_checkpoint import save_shards, worker_roles

    store = CheckpointStore(str(tmp_path / "ck"), run_id="run1")
    part = rank_state_bytes(0, "g0", {"actor": worker}, light=True)

    def shards(url):
        save_shards(f"{url}/g0.dcp", worker_roles(actor=worker))
        return {"sharded_groups": ["g0"]}

    meta = {"model": model_identity(cfg.model)}
    return store.save(1, {"g0-rank0.pt": part}, meta, before_commit=shards).path


def test_lora_shards_export_the_adapter_and_the_merged_model(tmp_path, monkeypatch):
    """A LoRA policy's shards (adapters only) export to peft's adapter and a merged model
    whose logits are the worker's; a config with another alpha is refused by name."""
    monkeypatch.setenv("RPEG_CACHE", str(tmp_path / "cache"))
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rpeg.errors import ConfigError
    from rpeg.runtime.export import export_checkpoint
    from rpeg.runtime.lora import adapters_disabled
    from rpeg.runtime.role_builder import build_roles

    cfg = _lora_cfg(tmp_path)
    w = build_roles(cfg, ["actor"], engine="torch").actor
    torch.manual_seed(0)
    with torch.no_grad():  # B starts at zero: nonzero so that the merge shows
        for n, p in w.lm.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.05)
    step = _sharded_checkpoint(tmp_path, cfg, w)
    out = tmp_path / "hf"
    export_checkpoint(step, str(out), config=cfg)
    assert len(load_file(str(out / "adapter" / "adapter_model.safetensors"))) == 8
    merged = AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=False)
    ids = torch.tensor([[1, 10, 11, 12, 13, 14, 15]])
    with torch.no_grad():
        want = w.lm(ids).logits
        got = merged(ids).logits
        with adapters_disabled(w.lm):
            base = w.lm(ids).logits
    # fp32, the same sums in another order: within 1e-5; the adapters move logits by >> that
    assert (got - want).abs().max() < 1e-5
    assert (base - want).abs().max() > 1e-3
    with pytest.raises(ConfigError, match="--config.*model.lora.*not the checkpoint's"):
        export_checkpoint(
            step,
            str(tmp_path / "hf2"),
            config=_lora_cfg(tmp_path, **{"model.lora": {"rank": 4, "alpha": 16}}),
        )


def test_neither_format_is_a_named_error(tmp_path):
    from rpeg.cli import main
    from rpeg.runtime.actors.checkpoint import CheckpointStore
    from rpeg.runtime.export import export_checkpoint

    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="no complete checkpoint.*rpeg export reads"):
        export_checkpoint(str(junk), str(tmp_path / "hf"))
    shards = tmp_path / "step-00000001" / "g0.dcp"
    shards.mkdir(parents=True)
    with pytest.raises(CheckpointError, match="shards alone: name the step folder"):
        export_checkpoint(str(shards), str(tmp_path / "hf"))
    # a committed step without any policy weights (a driver part only)
    store = CheckpointStore(str(tmp_path / "ck"), run_id="r")
    step = store.save(1, {"driver.pt": b"{}"}).path
    with pytest.raises(CheckpointError, match="neither a trainer.pt, nor a rank state"):
        export_checkpoint(step, str(tmp_path / "hf"))
    assert main(["export", str(junk), "--out", str(tmp_path / "hf")]) == 2


def test_a_resume_reads_plain_values_and_refuses_code(tmp_path):
    """load_shards (a resume) reads the same folders through the restricted readers: an int
    extra and AdamW's hyperparameters load; a value whose unpickling would call os.mkdir, or
    a crafted .metadata, is a CheckpointError and nothing is called."""
    from rpeg.runtime.actors.shard_checkpoint import load_shards, save_shards

    def roles():
        lin = torch.nn.Linear(3, 2)
        return lin, {"actor": (lin, torch.optim.AdamW(lin.parameters(), lr=0.25))}

    src, saved = roles()
    good = str(tmp_path / "good.dcp")
    save_shards(good, saved, {"policy_version": 3})
    dst, fresh = roles()
    fresh["actor"][1].param_groups[0]["lr"] = 1.0
    assert load_shards(good, fresh, {"policy_version": 0}) == {"policy_version": 3}
    assert torch.equal(dst.weight, src.weight)
    assert fresh["actor"][1].param_groups[0]["lr"] == 0.25  # a plain value, read back

    target = tmp_path / "ran"
    bad = str(tmp_path / "bad.dcp")
    save_shards(bad, roles()[1], {"evil": _Mkdir(str(target))})
    with pytest.raises(CheckpointError, match="evil: refused, not a plain value"):
        load_shards(bad, roles()[1], {"evil": 0})
    (tmp_path / "good.dcp" / ".metadata").write_bytes(pickle.dumps(_Mkdir(str(target))))
    with pytest.raises(CheckpointError, match="mkdir"):
        load_shards(good, roles()[1], {"policy_version": 0})
    assert not target.exists()
