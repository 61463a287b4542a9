"""Multi-turn tool rollouts (rpeg.runtime.envs.rollout) on the real vLLM engine: token in,
token out, the loss mask, the cut at ``</tool>``, per-row caps, and the torch engine's
transcript under greedy decoding.

The session's engine (conftest ``untied_engine``) gets the weights of its tiny model after a
few seconds of supervised training on three transcripts (two call the calculator, one
answers directly), so greedy decoding calls the tool; W0 is put back at the end. Expected
ids are worked from the char vocabulary (id = ord(c) - 27, BOS 1, EOS 2).
"""

from __future__ import annotations

import copy

import pytest
import torch

from rpeg.config import RunConfig
from rpeg.runtime.data import Example
from rpeg.runtime.envs.rollout import multiturn_rollout
from rpeg.runtime.envs.transcripts import transcript_batch

BOS, EOS = 1, 2
PROBLEMS = [("12x7?", "84", "12*7"), ("37x24?", "888", "37*24"), ("5x6?", "30", None)]


def ch(text: str) -> list[int]:
    return [4 if c == "\n" else ord(c) - 27 for c in text]


def _segments(answer: str, expr: str | None):
    if expr is None:
        return [(answer, True)]
    return [(f"<tool>calc({expr})</tool>", True), (f"<result>{answer}</result>", False)] + [
        (answer, True)
    ]


def _memorize(model, tok, steps: int = 400):
    """``model`` trained on the three transcripts (loss on the model's own tokens) until it
    reproduces them (mean NLL < 0.01): a few seconds on one thread."""
    ids, mask, lm = transcript_batch(tok, [(q, _segments(a, e)) for q, a, e in PROBLEMS])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        w = lm[:, 1:].float()
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        ).view_as(w)
        loss = (nll * w).sum() / w.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if float(loss.detach()) < 0.01:
            break
    model.eval()
    assert float(loss.detach()) < 0.01, f"not learned: mean NLL {float(loss.detach())}"
    return model


class Recording:
    """An engine that records what each generate call got and returned."""

    def __init__(self, engine):
        self.engine = engine
        self.calls: list[tuple[list[list[int]], list[int], list[list[int]]]] = []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompt_ids, params, *, seed=None, max_new_tokens=None):
        out = self.engine.generate(prompt_ids, params, seed=seed, max_new_tokens=max_new_tokens)
        raw = [out.response_ids[i, : int(n)].tolist() for i, n in enumerate(out.lengths)]
        self.calls.append(([list(p) for p in prompt_ids], list(max_new_tokens), raw))
        return out


def _config(max_response_tokens: int) -> RunConfig:
    return RunConfig.from_dict(
        {
            "task": {"multiturn": {"env": "tools", "max_turns": 3, "max_turn_tokens": 28}},
            "workload": {"max_response_tokens": max_response_tokens},
        }
    )


def _worker(model, tok, engine, c: RunConfig):
    from rpeg.runtime.roles import PolicyWorker

    w = PolicyWorker(model, tok, algorithm=c.algorithm, optim=c.optim, workload=c.workload, seed=0)
    w.engine = Recording(engine)
    return w


def _rollout(worker, c: RunConfig):
    examples = [Example(q, a) for q, a, _ in PROBLEMS]
    params = worker.sampling_params(greedy=True)
    return multiturn_rollout(worker, examples, 1, c.task.multiturn, params=params, seed=3)


@pytest.fixture(scope="module")
def trained(untied_engine):
    """(tokenizer, vLLM engine on the trained weights, the trained model); W0 back after."""
    model0, tok, eng = untied_engine
    w0 = {k: v.detach().clone() for k, v in model0.state_dict().items()}
    model = _memorize(copy.deepcopy(model0), tok)
    eng.update_weights({k: v.detach() for k, v in model.state_dict().items()}, policy_version=7)
    yield tok, eng, model
    eng.update_weights(w0, policy_version=0)


def test_transcripts_token_in_token_out_and_the_torch_engines(trained):
    from rpeg.runtime.engines.torch_engine import TorchEngine

    tok, eng, model = trained
    c = _config(max_response_tokens=64)
    w = _worker(model, tok, eng, c)
    batch, m = _rollout(w, c)
    call0, obs0 = ch("<tool>calc(12*7)</tool>"), ch("<result>84</result>")  # 23, 19 ids
    call1, obs1 = ch("<tool>calc(37*24)</tool>"), ch("<result>888</result>")  # 24, 20 ids
    want = [
        call0 + obs0 + ch("84") + [EOS],  # 45
        call1 + obs1 + ch("888") + [EOS],  # 48
        ch("30") + [EOS],  # 3
    ]
    for i, ids in enumerate(want):
        n = len(ids)
        assert batch.response_ids[i, :n].tolist() == ids, tok.decode(batch.response_ids[i])
        assert batch.response_attention[i].tolist() == [1] * n + [0] * (48 - n)
    assert batch.response_ids.shape == (3, 48)
    # the loss mask: the model's tokens only, never the observation
    assert batch.response_mask[0].tolist() == [1] * 23 + [0] * 19 + [1] * 3 + [0] * 3
    assert batch.response_mask[1].tolist() == [1] * 24 + [0] * 20 + [1] * 4
    assert batch.response_mask[2].tolist() == [1] * 3 + [0] * 45
    lp, mask = batch.sample_logprobs, batch.response_mask.bool()
    assert lp[~mask].eq(0).all() and lp[mask].le(0).all()
    assert batch.policy_version.tolist() == [7, 7, 7]
    # two generate calls: the first gave every row its turn cap (28); the engine wrote past
    # </tool> (greedy goes on), the transcript keeps the ids up to it (the cut)
    calls = w.engine.calls
    assert len(calls) == 2
    prompts = [[BOS, *ch(q)] for q, _, _ in PROBLEMS]
    assert calls[0][0] == prompts and calls[0][1] == [28, 28, 28]
    assert len(calls[0][2][0]) == 28 and calls[0][2][0][:23] == call0
    # token in: the second turn was generated from exactly the ids so far, as ids; its caps
    # are min(28, 64 - 42) and min(28, 64 - 44)
    assert calls[1][0] == [prompts[0] + call0 + obs0, prompts[1] + call1 + obs1]
    assert calls[1][1] == [22, 20]
    assert m["tool_use_rate"] == pytest.approx(2 / 3) and m["turns_mean"] == pytest.approx(5 / 3)
    assert m["env_reward_mean"] == 1.0 and m["env_errors"] == 0.0
    # the torch engine on the same weights: the same transcripts, log-probs within fp32 noise
    ref, _ = _rollout(_worker(model, tok, TorchEngine(model, 0, EOS), c), c)
    assert ref.response_ids.tolist() == batch.response_ids.tolist()
    assert ref.response_mask.tolist() == batch.response_mask.tolist()
    diff = float((ref.sample_logprobs - batch.sample_logprobs).abs().max())
    assert diff <= 1e-4, diff


def test_per_row_caps_reach_vllm(trained):
    """A 46-token transcript cap: after the observations row 0 has 46 - 42 = 4 tokens left
    ("84" + EOS fits), row 1 46 - 44 = 2 ("888" + EOS does not: cut at "88")."""
    tok, eng, model = trained
    c = _config(max_response_tokens=46)
    w = _worker(model, tok, eng, c)
    batch, m = _rollout(w, c)
    calls = w.engine.calls
    assert calls[1][1] == [4, 2]
    assert calls[1][2] == [ch("84") + [EOS], ch("88")]
    assert batch.response_ids[1].tolist()[-2:] == ch("88")
    assert m["mt_end/turn_tokens"] == 1.0
    assert batch.responses[1] == "<tool>calc(37*24)</tool><result>888</result>88"


def test_prefix_caching_as_documented(trained):
    """docs/multiturn.md: the engine is built with vLLM's automatic prefix caching as vLLM
    decides it (not set by RPEG); on vLLM 0.32's CPU build it is on, so a turn's KV for the
    shared prefix is reused by the next turn (the torch engine re-prefills)."""
    _, eng, _ = trained
    cache = eng.llm.llm_engine.vllm_config.cache_config
    assert cache.enable_prefix_caching is True


@pytest.mark.slow
def _train_multiturn(tmp_path, ranks: int) -> None:
    """``rpeg train --steps 2`` of the tool task with ``runtime.engine: vllm`` (``--local``
    for one rank; else Prefect + Dask with ``ranks`` ranks, each with its own vLLM engine and
    its own environments): the weights reach vLLM every step, every step has the multi-turn
    metrics and the rollout/trainer log-prob mismatch (fp32, processed log-probs: ~0 over
    whole transcripts), and no vLLM process or /dev/shm segment outlives the run."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import yaml
    from leaks import settle, shm_segments, vllm_processes
    from tiny_engines import tiny

    model, tok = tiny(tied=False, seed=0)
    model.save_pretrained(tmp_path / "tiny-hf", safe_serialization=True)
    tok.save_pretrained(tmp_path / "tiny-hf")
    cfg = {
        "model": {"name": "rpeg-tiny", "path": str(tmp_path / "tiny-hf")},
        "algorithm": {"name": "grpo"},
        "task": {
            "kind": "tool_arithmetic",
            "rewards": ["tool_final_answer"],
            "reward_modules": ["rpeg.runtime.envs.answers"],
            "heldout_size": 2,
            "multiturn": {"env": "tools", "max_turns": 2, "max_turn_tokens": 12},
        },
        "workload": {
            "num_prompts": 2,
            "samples_per_prompt": 2,
            "max_response_tokens": 40,
            "train_minibatches": 1,
        },
        "optim": {"warmup_sft_steps": 0},
        "runtime": {"engine": "vllm", "output_dir": str(tmp_path / "out")},
    }
    extra = ["--local"]
    if ranks > 1:
        from cpu_plans import all_units_on

        # the multi-turn graph fuses the env stage with generation (docs/multiturn.md)
        units = ("generate+env", "reward", "ref_logprob", "old_logprob", "advantage")
        cfg |= all_units_on((*units, "train_actor", "sync_weights"), ranks)
        extra = []
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    summary = tmp_path / "summary.json"
    env = dict(
        os.environ,
        PREFECT_HOME=str(tmp_path / "prefect"),
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="300",
    )
    env.pop("PREFECT_API_URL", None)
    shm0, procs0 = shm_segments(), vllm_processes()
    rpeg = Path(sys.executable).parent / "rpeg"
    run = subprocess.run(
        [str(rpeg), "train", str(config), *extra, "--steps", "2"]
        + ["--summary-json", str(summary)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert not settle(lambda: vllm_processes() - procs0), "a vLLM process outlived the run"
    assert not settle(lambda: shm_segments() - shm0), "a /dev/shm segment outlived the run"
    out = json.loads(summary.read_text())
    assert out["steps"] == 2 and out["weight_sync_bytes"] > 0
    rows = [
        json.loads(x)
        for x in (tmp_path / "out" / "latest" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["weight_sync_bytes"] > 0
        assert {"tool_use_rate", "turns_mean", "env_s", "env_errors"} <= set(r), sorted(r)
        assert r["turns_mean"] >= 1.0 and r["env_errors"] == 0.0
        assert 0 <= r["logprob_mismatch_mean"] < 1e-4


def test_train_local_multiturn_with_vllm(tmp_path):
    _train_multiturn(tmp_path, ranks=1)


def test_train_distributed_multiturn_with_vllm_two_ranks(tmp_path):
    """Both halves tested apart before (distributed multi-turn on the torch engine, local
    multi-turn on vLLM); here as one run: two ranks, each with its vLLM engine."""
    _train_multiturn(tmp_path, ranks=2)
