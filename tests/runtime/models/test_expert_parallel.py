"""Expert parallelism (issue 40 item 3, the mechanism: rpeg.runtime.expert_parallel): the
experts of a tiny MoE split over two gloo ranks, each rank running half the batch, give the
one-process logits and gradients (1e-5)."""

from __future__ import annotations

import pytest
import torch

from tests.runtime.models import ranks

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("model_type", "port"),
    [("qwen3_moe", 29831), ("mixtral", 29833), ("gpt_oss", 29835), ("qwen3_next", 29845)],
)
def test_ep2_equals_one_process(model_type, port):
    ref = ranks.ep_reference(model_type)
    out = ranks.spawn(2, "ep_case", port, model_type=model_type)
    cfg = ranks.model(model_type).config
    experts = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    split = []
    for r in (0, 1):
        torch.testing.assert_close(out[r]["logits"], ref["logits"][r : r + 1], atol=1e-5, rtol=0)
    for n, g in ref["grads"].items():
        if out[0]["grads"][n].shape[:1] != g.shape[:1] and g.shape[0] == experts:
            got = torch.cat([out[0]["grads"][n], out[1]["grads"][n]])  # each rank's experts
            split.append(n)
        else:
            got = out[0]["grads"][n]
            torch.testing.assert_close(out[1]["grads"][n], got, atol=0, rtol=0, msg=n)
        torch.testing.assert_close(got, g, atol=1e-5, rtol=1e-4, msg=n)
    assert len(split) >= 4  # 2 MoE layers x (gate_up, down): every rank held half the experts


TOL = 1e-5


def _same_step(got: list[dict], ref: dict) -> None:
    """Two dp ranks' metrics of one step (the losses are each rank's share: their mean is the
    global loss; the gradient norm is global) and rank 0's full weights after it."""
    for key in ("pg_loss", "kl", "entropy"):
        mean = sum(g["metrics"][key] for g in got) / len(got)
        assert mean == pytest.approx(ref["metrics"][key], abs=TOL), key
    for g in got:
        assert g["metrics"]["grad_norm"] == pytest.approx(ref["metrics"]["grad_norm"], abs=TOL)
    assert set(got[0]["weights"]) == set(ref["weights"])  # the unsplit names
    for k, v in ref["weights"].items():
        torch.testing.assert_close(got[0]["weights"][k], v, atol=TOL, rtol=0, msg=k)


def test_ep2_fsdp_rank_path_equals_one_process_and_resumes_at_ep1(tmp_path):
    """The compiled step's path (PolicyWorker.apply_layout: rpeg.runtime.sharding.shard_roles
    -> expert_parallel.expert_shards): fsdp dp=2 x ep=2, built on the meta device with each
    rank's experts only; one GRPO step gives the one-process losses, gradient norm and weights
    (1e-5); greedy decode with different row counts and lengths per rank (lockstep over the
    all-to-alls) gives one process's tokens; the DCP checkpoint (unsplit names) resumes at
    ep=1 (fsdp dp=2) with the one-process second step."""
    ref, tokens = ranks.ep_reference_steps("qwen3_moe", steps=2)
    out = ranks.spawn(
        2,
        "ep_layout_case",
        29837,
        model_type="qwen3_moe",
        layout={"dp": 2, "ep": 2, "fsdp": True},
        resume={"dp": 2, "fsdp": True},
        url=str(tmp_path / "ck"),
    )
    for step in (0, 1):
        _same_step([out[r]["steps"][step] for r in (0, 1)], ref[step])
    for r in (0, 1):
        assert out[r]["tokens"] == tokens[r]
        assert out[r]["local"] <= 0.55 * out[r]["full"]  # FSDP halves the rest, ep the experts


def test_ep2_replicas_rank_path_equals_one_process():
    """dp=2 replicas x ep=2 (no FSDP): the non-expert gradients averaged over dp, the experts'
    summed over their ep group; a rank holds half the experts and the rest whole."""
    ref, tokens = ranks.ep_reference_steps("mixtral", steps=1)
    out = ranks.spawn(2, "ep_layout_case", 29839, model_type="mixtral", layout={"dp": 2, "ep": 2})
    _same_step([out[r]["steps"][0] for r in (0, 1)], ref[0])
    for r in (0, 1):
        assert out[r]["tokens"] == tokens[r]
        assert 0.55 * out[r]["full"] < out[r]["local"] < 0.8 * out[r]["full"]


def test_trains_on_prefect_dask_at_ep2_fsdp_dp2_checkpoints_and_exports(
    tmp_path, prefect_harness, dask_cluster
):
    """The compiled step at ep=2 (fsdp dp=2, one group): 2 GRPO steps of a tiny Qwen3-MoE
    folder on Prefect + Dask with finite losses and ``routing_mismatch`` logged each step;
    each rank holds half the model; the checkpoint's shards and the HF export (experts
    gathered) hold the whole model, which transformers reloads."""
    import json

    from rpeg.flows.entry import train_on
    from transformers import AutoModelForCausalLM

    from tests.runtime.models.test_models_distributed import IDS, fsdp_dp2_config
    from tests.runtime.models.tiny_folders import write_tiny_folder

    folder = write_tiny_folder("qwen3_moe", tmp_path / "model")
    cfg = fsdp_dp2_config(folder, tmp_path).with_overrides(
        {
            "plan.units.train_actor": {"devices": "0-1", "engine": "fsdp", "ep": 2},
            "algorithm.routing_replay": "record",
        }
    )
    s = train_on(dask_cluster, cfg, progress=False)
    assert s["steps"] == 2
    (group,) = s["layout"]
    assert (s["layout"][group]["ep"], s["layout"][group]["dp"]) == (2, 2)
    assert all(b < 0.6 * s["full_param_bytes"] for b in s["param_bytes_per_rank"][group])
    metrics = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert all(
            torch.isfinite(torch.tensor(m[k])) for k in ("pg_loss", "grad_norm", "router_aux_loss")
        )
        assert 0.0 <= m["routing_mismatch"] <= 1.0
    hf = AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "out" / "hf" / "step-00000002"), trust_remote_code=False
    ).eval()
    start = AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=False).eval()
    assert hf.model.layers[0].mlp.experts.gate_up_proj.shape[0] == 4  # every expert
    with torch.no_grad():
        after, before = hf(input_ids=IDS).logits, start(input_ids=IDS).logits
    assert torch.isfinite(after).all() and not torch.allclose(before, after)


def test_a_whole_generation_copy_gets_the_gathered_experts_each_step(
    tmp_path, prefect_harness, dask_cluster
):
    """Training at fsdp dp=2 x ep=2, generation at tp=2: the ranks' engine is a whole-expert
    copy (ep=1) refreshed each step by the weight sync, which gathers the split experts
    (rpeg.runtime.sharding.full_tensor_source); its sampling log-probs equal the trainer's
    at step 2, after an update at lr 1e-2 moved the weights (a stale or half-synced copy
    would differ)."""
    import json

    from rpeg.flows.entry import train_on

    from tests.runtime.models.test_models_distributed import fsdp_dp2_config
    from tests.runtime.models.tiny_folders import write_tiny_folder

    folder = write_tiny_folder("qwen3_moe", tmp_path / "model")
    cfg = fsdp_dp2_config(folder, tmp_path).with_overrides(
        {
            "plan.units.generate": {"devices": "0-1", "tp": 2},
            "plan.units.train_actor": {"devices": "0-1", "engine": "fsdp", "ep": 2},
            "optim.lr": 1e-2,
            "runtime.export_hf": False,
            "runtime.checkpoint_url": None,
        }
    )
    s = train_on(dask_cluster, cfg, progress=False)
    (group,) = s["layout"]
    assert (s["layout"][group]["ep"], s["layout"][group]["gen_tp"]) == (2, 2)
    metrics = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert metrics[0]["grad_norm"] > 0  # step 1 moved the weights (AdamW at lr 1e-2)
    assert metrics[1]["logprob_mismatch_max"] < 1e-4
