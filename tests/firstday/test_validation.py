"""Issue 41 item 3: validation as verl users know it -- a separate validation file
(``task.val_url``), validation every N steps (``runtime.val_every``), ``val_before_train``,
``val/<metric>`` per data source in metrics.jsonl and TensorBoard on both runtimes, and a
held-out split the console names with its size."""

from __future__ import annotations

import json

import pytest

from rpeg.config import RunConfig
from rpeg.runtime.step import messages as M
from tests.firstday.conftest import run_yaml
from tests.runtime.actors.test_scheduler import K1, SYNC, Sim, make

SOURCES = ("openai/gsm8k", "lighteval/MATH")


def write_val_jsonl(path, n: int = 6):
    """A validation file in another kind than the training Parquet: verl-style JSONL rows,
    half of them from each source."""
    rows = []
    for i in range(n):
        rows.append(
            {
                "data_source": SOURCES[i % 2],
                "prompt": [{"role": "user", "content": f"What is {i} plus 1? Answer after ####."}],
                "reward_model": {"ground_truth": str(i + 1)},
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _cfg(user_files, tmp_path, **runtime):
    from rpeg.runtime.datasets.fit import fit_prompt_lengths

    cfg = RunConfig.from_yaml(run_yaml(user_files, tmp_path))
    over = {f"runtime.{k}": v for k, v in runtime.items()}
    return fit_prompt_lengths(cfg.with_overrides(over))


# ------------------------------------------------------------------- the data and its split
def test_val_url_is_the_heldout_set_and_the_training_file_keeps_every_row(user_files, tmp_path):
    from rpeg.runtime.datasets.fit import fit_prompt_lengths, task_tokenizer
    from rpeg.runtime.task_data import build_task_data

    cfg = RunConfig.from_yaml(run_yaml(user_files, tmp_path))
    said: list[str] = []
    fit_prompt_lengths(cfg, said.append)
    # heldout_size 4 of the 24 rows: the console names the split and its size
    assert any("data: 20 train prompts, 4 held out from the training file" in s for s in said)

    val = write_val_jsonl(tmp_path / "val.jsonl")
    cfg = cfg.with_overrides({"task.val_url": val})
    said.clear()
    fitted = fit_prompt_lengths(cfg, said.append)
    assert any("data: 24 train prompts; validation: 6 prompts from val.jsonl" in s for s in said)
    cursor, heldout = build_task_data(
        fitted.task, task_tokenizer(fitted), fitted.workload.max_prompt_tokens
    )
    assert len(cursor.source) == 24
    assert [e.answer for e in heldout] == [str(i + 1) for i in range(6)]
    assert [e.data_source for e in heldout] == [SOURCES[i % 2] for i in range(6)]
    assert all(e.rendered.startswith("<|im_start|>user\n") for e in heldout)  # as trained


def test_a_missing_or_bad_validation_file_is_refused_naming_task_val_url(tmp_path):
    from rpeg.preflight.inputs import check_task

    cfg = RunConfig.model_validate({"task": {"val_url": str(tmp_path / "none.parquet")}})
    assert [p.where for p in check_task(cfg)] == ["task.val_url"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1?"}\n')
    cfg = RunConfig.model_validate({"task": {"val_url": str(bad)}})
    problems = check_task(cfg)
    assert problems and "answer" in problems[0].what


# ------------------------------------------------------------------- the validation metrics
def test_batch_metrics_per_source_and_pass_at_k():
    import torch

    from rpeg.runtime.batch import RolloutBatch
    from rpeg.runtime.validation import batch_metrics

    # two prompts x 2 samples: gsm8k prompt right once, MATH prompt never
    n = 4
    batch = RolloutBatch(
        prompt_ids=torch.ones(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        response_ids=torch.ones(n, 1, dtype=torch.long),
        response_mask=torch.ones(n, 1, dtype=torch.long),
        sample_logprobs=torch.zeros(n, 1),
        policy_version=torch.zeros(n, dtype=torch.long),
        group_ids=torch.tensor([0, 0, 1, 1]),
        rewards=torch.tensor([1.0, 0.0, 0.0, 0.0]),
        correct=torch.tensor([1.0, 0.0, 0.0, 0.0]),
        data_sources=["openai/gsm8k"] * 2 + ["lighteval/MATH"] * 2,
    )
    m = batch_metrics(batch, samples=2)
    assert m["val/accuracy"] == 0.25 and m["val/pass@2"] == 0.5 and m["val/prompts"] == 2
    assert m["val/openai/gsm8k/accuracy"] == 0.5 and m["val/openai/gsm8k/pass@2"] == 1.0
    assert m["val/lighteval/MATH/pass@2"] == 0.0


# ------------------------------------------------------------------- --local
def test_local_validates_every_n_steps_into_the_step_line_and_tensorboard(user_files, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rpeg.runtime.local_trainer import LocalTrainer

    cfg = _cfg(user_files, tmp_path, steps=3, val_every=2, checkpoint_url=None)
    cfg = cfg.with_overrides({"task.val_url": write_val_jsonl(tmp_path / "val.jsonl")})
    said: list[str] = []
    tr = LocalTrainer(cfg, log=said.append)
    summary = tr.run()
    lines = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert ["val/accuracy" in m for m in lines] == [False, True, True]  # step 2 and the last
    for key in ("val/openai/gsm8k/accuracy", "val/lighteval/MATH/accuracy", "val/reward"):
        assert key in lines[1]
    assert lines[2]["val/prompts"] == 6
    assert summary["heldout_acc_after"] == lines[2]["val/accuracy"]
    assert any(s.startswith("validation before RL: accuracy") for s in said)
    assert any(s.startswith("validation after step 2: accuracy") for s in said)
    events = EventAccumulator(str(tmp_path / "out" / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("val/accuracy")] == [0, 2, 3]


def test_local_without_val_before_train_skips_the_first_validation(user_files, tmp_path):
    from rpeg.runtime.local_trainer import LocalTrainer
    from rpeg.runtime.summary import heldout_phrase

    cfg = _cfg(user_files, tmp_path, steps=1, val_before_train=False, checkpoint_url=None)
    said: list[str] = []
    summary = LocalTrainer(cfg, log=said.append).run()
    assert not any("before RL" in s for s in said)
    assert summary["heldout_acc_before"] is None
    assert "val_before_train: false" in heldout_phrase(summary)


# ------------------------------------------------------------------- the distributed schedule
class _ValSim(Sim):
    def result(self, ins):
        if isinstance(ins, M.Evaluate):
            acc = {"before": 0.25}.get(ins.when, 0.5 if ins.when != "after step 3" else 0.75)
            return {"val/accuracy": acc, "val/openai/gsm8k/accuracy": acc}
        return super().result(ins)


@pytest.mark.parametrize("case", [SYNC, K1])
def test_the_scheduler_validates_every_n_steps_into_the_step_record(case):
    sim = _ValSim(make(case, 3, val_every=2))
    sim.run()
    evals = [i.when for i in sim.emitted if isinstance(i, M.Evaluate)]
    assert evals == ["before", "after step 2", "after step 3"]  # no second one at the end
    assert [("val/accuracy" in m) for _, m in sim.records] == [False, True, True]
    assert sim.records[1][1]["val/openai/gsm8k/accuracy"] == 0.5
    assert (sim.outcome.acc_before, sim.outcome.acc_after) == (0.25, 0.75)


def test_the_scheduler_without_val_before_train():
    sim = _ValSim(make(SYNC, 2, val_before_train=False))
    sim.run()
    assert [i.when for i in sim.emitted if isinstance(i, M.Evaluate)] == ["after step 2"]
    assert sim.outcome.acc_before is None and sim.outcome.acc_after == 0.5


def test_a_deployment_with_engine_local_validates_every_n_steps(user_files, tmp_path):
    """The deployed flow's single-process engine (the one entry, ``train(config,
    local=True)``) follows runtime.val_every and val_before_train as --local does."""
    from rpeg.flows.entry import train_on

    cfg = _cfg(user_files, tmp_path, steps=3, val_every=2, checkpoint_url=None)
    cfg = cfg.with_overrides({"runtime.val_before_train": False})
    summary = train_on(None, cfg, local=True, progress=False)
    history = summary["_extra"]["history"]
    assert ["val/accuracy" in m for m in history] == [False, True, True]
    assert summary["heldout_acc_before"] is None
    assert summary["heldout_acc_after"] == history[-1]["val/accuracy"]
