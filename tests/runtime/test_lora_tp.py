"""LoRA under tensor parallelism (rpeg.runtime.lora_tp; docs/lora.md "Tensor parallelism"):
a hand-worked toy split column-wise then row-wise, a LoRA policy at tp=2 and tp=2 x fsdp dp=2
equal to one process (logits, loss, adapter gradients, one step's merged weights), its
adapter-only checkpoints (rank state, DCP shards resumed on one process), the layers this
split refuses by name, and -- slow -- `rpeg train` of the shipped LoRA config at a tp=2 plan.

The toy (lora_tp_cases.toy): x = [1, 2, 3, 4]; q_proj and o_proj with W = I, rank 1,
alpha 2 (scale s = 2); A_q = [1, 0, 0, 0], B_q = [1, 0, 0, 1]^T, A_o = [1, 0, 0, 1],
B_o = [0, 0, 0, 1]^T; loss = sum(o).

  A_q x = 1                     q = x + s B_q * 1 = [3, 2, 3, 6]
  A_o q = 3 + 6 = 9             o = q + s B_o * 9 = [3, 2, 3, 24]
  do = [1, 1, 1, 1]             B_o^T do = 1
  grad B_o = s do (A_o q)   = [18, 18, 18, 18]^T
  grad A_o = s (B_o^T do) q = [6, 4, 6, 12]
  dq = W_o^T do + s A_o^T (B_o^T do) = [1, 1, 1, 1] + [2, 0, 0, 2] = [3, 1, 1, 3]
  grad B_q = s dq (A_q x)   = [6, 2, 2, 6]^T
  grad A_q = s (B_q^T dq) x = 2 * (3 + 3) * [1, 2, 3, 4] = [12, 24, 36, 48]
  dx = dq + s A_q^T (B_q^T dq) = [3, 1, 1, 3] + [12, 0, 0, 0] = [15, 1, 1, 3]

At tp=2 each rank computes only its share of the replicated factors' gradients until
sum_partial_grads (once per optimizer step) adds them: grad A_q, rank 0 sees
s B_q[0:2]^T dq[0:2] = 2 * 3 = 6 -> 6 x = [6, 12, 18, 24], rank 1 s B_q[2:4]^T dq[2:4] =
2 * 3 -> the same, 12 x summed; grad B_o, rank 0 sees s A_o[0:2] q[0:2] = 2 * 3 = 6, rank 1
s A_o[2:4] q[2:4] = 2 * 6 = 12, 18 summed. The split factors' gradients are the rank's rows
(B_q: [6, 2] and [2, 6]) or columns (A_o: [6, 4] and [6, 12]) of the full ones."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("peft")

OUT = torch.tensor([[3.0, 2.0, 3.0, 24.0]])
GRADS = {
    "q_proj.lora_A.default.weight": torch.tensor([[12.0, 24.0, 36.0, 48.0]]),
    "q_proj.lora_B.default.weight": torch.tensor([[6.0], [2.0], [2.0], [6.0]]),
    "o_proj.lora_A.default.weight": torch.tensor([[6.0, 4.0, 6.0, 12.0]]),
    "o_proj.lora_B.default.weight": torch.tensor([[18.0], [18.0], [18.0], [18.0]]),
}
X_GRAD = torch.tensor([[15.0, 1.0, 1.0, 3.0]])


#: each rank's own gradients before the sum over tp (the module docstring works them out)
PARTIAL = {
    0: {
        "q_proj.lora_A.default.weight": torch.tensor([[6.0, 12.0, 18.0, 24.0]]),
        "q_proj.lora_B.default.weight": torch.tensor([[6.0], [2.0]]),
        "o_proj.lora_A.default.weight": torch.tensor([[6.0, 4.0]]),
        "o_proj.lora_B.default.weight": torch.tensor([[6.0], [6.0], [6.0], [6.0]]),
    },
    1: {
        "q_proj.lora_A.default.weight": torch.tensor([[6.0, 12.0, 18.0, 24.0]]),
        "q_proj.lora_B.default.weight": torch.tensor([[2.0], [6.0]]),
        "o_proj.lora_A.default.weight": torch.tensor([[6.0, 12.0]]),
        "o_proj.lora_B.default.weight": torch.tensor([[12.0], [12.0], [12.0], [12.0]]),
    },
}


def _check_toy(res: dict) -> None:
    assert torch.equal(res["y_nograd"], OUT)
    assert torch.equal(res["y"], OUT)
    assert torch.equal(res["x_grad"], X_GRAD)
    assert res["grads"].keys() == GRADS.keys()
    for k, v in GRADS.items():
        assert torch.equal(res["grads"][k], v), k


def test_the_toy_on_one_process_gives_the_hand_worked_values():
    import lora_tp_cases as T

    _check_toy(T.toy_run(T.toy()))


def test_what_the_split_does_not_take_is_refused_by_name():
    """DoRA layers, a wrapper over a non-Linear, an unknown style: named errors before any
    mesh is used (none is reachable from model.lora, whose peft config is plain LoRA)."""
    import lora_tp_cases as T
    from peft import LoraConfig, inject_adapter_in_model

    from rpeg.runtime.lora_tp import shard_lora_linear

    dora = inject_adapter_in_model(
        LoraConfig(r=1, target_modules=["q_proj"], use_dora=True), T.Toy()
    )
    with pytest.raises(ValueError, match=r"layers\.0\.self_attn\.q_proj.*DoRA"):
        shard_lora_linear(dora.q_proj, "colwise", None, where="layers.0.self_attn.q_proj")
    with pytest.raises(TypeError, match="only peft's lora.Linear"):
        shard_lora_linear(torch.nn.Linear(4, 4), "colwise", None)
    with pytest.raises(ValueError, match="allowed colwise, rowwise"):
        shard_lora_linear(T.toy().q_proj, "diagonal", None)


def test_apply_lora_layers_split_themselves_and_a_foreign_wrapper_is_named(tiny):
    """apply_lora gives every injected layer lora_tp.LoraLinear (peft's forward, plus
    split_for_tp); a peft model injected elsewhere is refused by the TP plan by name, before
    any mesh is used."""
    from types import SimpleNamespace

    from peft import LoraConfig, inject_adapter_in_model

    from rpeg.config import LoraSection
    from rpeg.runtime.lora import apply_lora, lora_layers
    from rpeg.runtime.lora_tp import LoraLinear
    from rpeg.runtime.tensor_parallel import apply_tensor_parallel

    model, _ = tiny
    m = apply_lora(copy.deepcopy(model), LoraSection(rank=2, target_modules=["q_proj"]))
    assert [type(x).__name__ for _, x in lora_layers(m)] == ["LoraLinear"] * 2
    assert all(isinstance(x, LoraLinear) for _, x in lora_layers(m))
    foreign = inject_adapter_in_model(
        LoraConfig(r=2, target_modules=["q_proj"]), copy.deepcopy(model)
    )
    two = SimpleNamespace(size=lambda: 2)
    with pytest.raises(TypeError, match=r"layers\.0\.self_attn\.q_proj is a Linear wrapper"):
        apply_tensor_parallel(foreign, two)


# ------------------------------------------------------------------------------ spawned
@pytest.fixture(scope="module")
def tp1_saved(tmp_path_factory):
    """A one-process LoRA policy's DCP shards after one step (and its next step's weights)."""
    import lora_tp_cases as T

    url = str(tmp_path_factory.mktemp("lora_tp1") / "shards")
    return {"url": url, **T.one_process_checkpoint(url)}


@pytest.fixture(scope="module")
def tp2(tmp_path_factory, tp1_saved):
    """One spawn of two ranks: the toy split and a LoRA policy at tp=2 (DCP shards saved),
    and the one-process shards of ``tp1_saved`` resumed at tp=2."""
    import lora_tp_cases as T

    url = str(tmp_path_factory.mktemp("lora_tp") / "shards")
    cases = [
        ("toy", "toy", {"layout": {"dp": 1, "tp": 2}}),
        ("policy", "policy", {"layout": {"dp": 1, "tp": 2}, "url": url}),
        ("dropout", "dropout", {"layout": {"dp": 1, "tp": 2}}),
        ("resume", "resume", {"layout": {"dp": 1, "tp": 2}, "url": tp1_saved["url"]}),
    ]
    out = T.spawn(2, cases, port=29771)
    return out, url


@pytest.fixture(scope="module")
def single():
    import lora_tp_cases as T

    return T.reference()


def _check_policy(res: dict, ref: dict) -> None:
    torch.testing.assert_close(res["logits"], ref["logits"], atol=1e-5, rtol=0)
    assert float(res["loss"]) == pytest.approx(float(ref["loss"]), abs=1e-6)
    # the adapters alone require gradients: 2 layers x 7 targets x (A, B)
    assert res["grads"].keys() == ref["grads"].keys() and len(ref["grads"]) == 28
    for k, v in ref["grads"].items():
        torch.testing.assert_close(res["grads"][k], v, atol=1e-6, rtol=0, msg=k)
    lp = ref["logprobs"][res["rows"]]
    torch.testing.assert_close(res["logprobs"], lp, atol=1e-5, rtol=0)
    if res["tokens"] is not None:  # greedy decode on the shards (tp ranks decode the same)
        assert res["tokens"] == ref["tokens"]
    assert res["metrics"]["grad_norm"] == pytest.approx(ref["metrics"]["grad_norm"], abs=1e-5)
    assert res["merged"].keys() == ref["merged"].keys()
    for k, v in ref["merged"].items():
        torch.testing.assert_close(res["merged"][k], v, atol=1e-5, rtol=0, msg=k)


@pytest.mark.slow  # two spawned ranks: ~30-40 s on the loaded 2-core machine
def test_the_toy_split_at_tp2_gives_the_hand_worked_values(tp2):
    out, _ = tp2
    for r in (0, 1):
        res = out["toy"][r]
        _check_toy(res)
        assert res["partial"].keys() == PARTIAL[r].keys()
        for k, v in PARTIAL[r].items():
            assert torch.equal(res["partial"][k], v), (r, k)
        assert res["placements"] == {
            "q_proj.base_layer.weight": "(Shard(dim=0),)",
            "q_proj.lora_A.default.weight": "(Replicate(),)",
            "q_proj.lora_B.default.weight": "(Shard(dim=0),)",
            "o_proj.base_layer.weight": "(Shard(dim=1),)",
            "o_proj.lora_A.default.weight": "(Shard(dim=1),)",
            "o_proj.lora_B.default.weight": "(Replicate(),)",
        }


@pytest.mark.slow
def test_a_lora_policy_at_tp2_equals_one_process(tp2, single):
    """Adapters on all seven Linear kinds (B nonzero), dropout 0: the same logits, loss and
    adapter gradients after one backward, the same log-probs and greedy tokens without
    autograd (one sum per row-wise layer), and after one train step the same merged weights
    (what weight sync sends) and gradient norm."""
    out, _ = tp2
    for r in (0, 1):
        res = out["policy"][r]
        assert res["classes"] == ["ColwiseLoraLinear", "RowwiseLoraLinear"]
        _check_policy(res, single)


@pytest.mark.slow
def test_dropout_at_tp2_keeps_the_replicated_factors_equal_on_both_ranks(tp2):
    """Dropout 0.5 with each rank's own generator (masks that differ between ranks, so not
    one process's): the step runs, and the replicated factors (column-wise A, row-wise B: 2
    layers x 5 + 2 x 2 = 14 tensors) are still equal on both ranks after it, since their
    gradients are summed over tp before the update."""
    out, _ = tp2
    a, b = out["dropout"][0], out["dropout"][1]
    assert len(a["replicated"]) == 14 and a["replicated"].keys() == b["replicated"].keys()
    for k, v in a["replicated"].items():
        assert torch.equal(v, b["replicated"][k]), k
    assert a["metrics"]["grad_norm"] == b["metrics"]["grad_norm"] > 0


@pytest.mark.slow
def test_tp2_checkpoints_hold_adapters_only_and_resume_on_one_process(tp2, single):
    """The rank state (gathered) and the DCP shards hold the 28 adapter tensors only; the
    shards, written at tp=2, load into a one-process LoRA worker (tp2 -> tp1) with the
    merged weights of the single-process step and the optimizer's step count; the rank
    state's adapters load into one too."""
    import lora_tp_cases as T
    import sharding_cases as C
    import torch.distributed.checkpoint as dcp

    from rpeg.runtime.actors.shard_checkpoint import load_shards, worker_extras, worker_roles
    from rpeg.runtime.lora import is_adapter_key, load_adapter_state

    out, url = tp2
    res = out["policy"][0]
    assert len(res["weights"]) == 28 and all(is_adapter_key(k) for k in res["weights"])
    assert res["optim_keys"] == sorted(res["weights"])  # rank 0's gathered AdamW state
    saved = dcp.FileSystemReader(url).read_metadata().state_dict_metadata
    model_keys = [k for k in saved if k.startswith("actor.model.")]
    assert len(model_keys) == 28 and all(is_adapter_key(k) for k in model_keys)
    w = T.lora_policy(C.config())
    before = w.get_weights()
    key = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(before[key], single["merged"][key], atol=1e-5)
    load_shards(url, worker_roles(actor=w), worker_extras(actor=w))
    after = w.get_weights()
    for k, v in single["merged"].items():
        torch.testing.assert_close(after[k], v, atol=1e-5, rtol=0, msg=k)
    assert w.optimizer.state_dict()["state"][0]["step"] == 1
    v = T.lora_policy(C.config())
    load_adapter_state(v.module, res["weights"])
    torch.testing.assert_close(v.get_weights()[key], single["merged"][key], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_one_process_lora_shards_resume_at_tp2(tp2, tp1_saved):
    """tp1 -> tp2 (beside tp2 -> tp1 above): the shards a one-process LoRA worker wrote after
    one step load into both tp=2 ranks (each reads its slices of the split factors, the
    replicated ones whole, and their AdamW moments): the same merged weights and policy
    version, AdamW's moments (gathered on rank 0) bit for bit, and the next step gives the one
    process's next weights and gradient norm. Measured (2026-12-03 07:53 UTC): merged after
    the load 0.0 apart, after the next step 1.5e-8 (that step moves them by 1.4e-3), gradient
    norms 1.2e-7 apart."""
    out, _ = tp2
    moments = out["resume"][0]["moments"]
    assert moments.keys() == tp1_saved["moments"].keys() and len(moments) == 28
    for k, (m, v) in tp1_saved["moments"].items():
        assert torch.equal(moments[k][0], m) and torch.equal(moments[k][1], v), k
    for r in (0, 1):
        res = out["resume"][r]
        assert res["version"] == 1
        for k, v in tp1_saved["merged1"].items():
            torch.testing.assert_close(res["merged1"][k], v, atol=1e-6, rtol=0, msg=k)
        key = "model.layers.0.self_attn.q_proj.weight"
        assert not torch.allclose(tp1_saved["merged2"][key], tp1_saved["merged1"][key])
        for k, v in tp1_saved["merged2"].items():
            torch.testing.assert_close(res["merged2"][k], v, atol=1e-5, rtol=0, msg=k)
        want = tp1_saved["metrics"]["grad_norm"]
        assert res["metrics"]["grad_norm"] == pytest.approx(want, abs=1e-5)


@pytest.mark.slow  # four spawned ranks on two cores: ~80 s
def test_tp2_x_fsdp_dp2_lora_equals_one_process(single):
    import lora_tp_cases as T

    out = T.spawn(4, [("x", "policy", {"layout": {"dp": 2, "tp": 2, "fsdp": True}})], 29791)
    for r in range(4):
        res = out["x"][r]
        # FSDP's dp dim, then the tp placement of the split
        assert res["placements"]["q_proj.lora_A.default.weight"] == "(Shard(dim=0), Replicate())"
        assert res["placements"]["o_proj.lora_A.default.weight"] == "(Shard(dim=0), Shard(dim=1))"
        _check_policy(res, single)


@pytest.mark.slow  # a Dask cluster of two workers, two steps: ~60 s
def test_rpeg_train_of_the_lora_config_at_tp2_checkpoints_adapters_only(tmp_path):
    """configs/lora-cpu.yaml with configs/tp2-cpu.yaml's plan (every unit tp=2), shrunk: the
    run trains and its checkpoint's shards hold the 24 adapter tensors (2 layers x 6 targets
    x (A, B)) with their AdamW state; the rank parts hold no weights."""
    from pathlib import Path

    import torch.distributed.checkpoint as dcp
    import yaml

    from rpeg.cli import main
    from rpeg.runtime.lora import is_adapter_key

    root = Path(__file__).resolve().parents[2] / "configs"
    d = yaml.safe_load((root / "lora-cpu.yaml").read_text())
    tp = yaml.safe_load((root / "tp2-cpu.yaml").read_text())
    d |= {"cluster": tp["cluster"], "plan": tp["plan"]}
    d["model"]["tiny_shape"] = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    d["workload"] = {
        "num_prompts": 2,
        "samples_per_prompt": 2,
        "max_response_tokens": 6,
        "micro_batch_size": 4,
    }
    d["task"]["heldout_size"] = 2
    d["optim"]["warmup_sft_steps"] = 0
    d["runtime"] = {
        "steps": 2,
        "checkpoint_every": 2,
        "checkpoint_url": str(tmp_path / "ck"),
        "output_dir": str(tmp_path / "out"),
    }
    assert all(u.get("tp") == 2 for k, u in d["plan"]["units"].items() if k != "reward")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(d))
    assert main(["train", str(cfg), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    (shards,) = list((tmp_path / "ck").rglob("*.dcp"))
    saved = dcp.FileSystemReader(str(shards)).read_metadata().state_dict_metadata
    model = [k for k in saved if k.startswith("actor.model.")]
    assert len(model) == 24 and all(is_adapter_key(k) for k in model)
    optim = {k.split(".state.")[1].rsplit(".", 1)[0] for k in saved if ".state." in k}
    assert optim == {k[len("actor.model.") :] for k in model}
    from rpeg.runtime.actors.checkpoint import loads

    for part in shards.parent.glob("*-rank*.pt"):
        st = loads(part.read_bytes())
        assert "module" not in st["actor"], part.name
