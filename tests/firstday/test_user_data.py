"""A verl or TRL user's data as it is: rows, chat template, prompt lengths, samples, export."""

import json

import pytest
import torch

from rpeg.config import RunConfig, TaskConfig
from rpeg.errors import ConfigError
from rpeg.runtime.data import RowKeys, load_examples
from rpeg.runtime.datasets.prompts import prompt_format, render, render_examples
from tests.firstday.conftest import run_yaml
from tests.firstday.tiny_hf import QUESTIONS

VERL = RowKeys(prompt_key="prompt", answer_key="reward_model.ground_truth")


def _tok(user_files):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(user_files["model"], trust_remote_code=False)


def test_verl_parquet_as_it_is(user_files):
    ex = load_examples(user_files["verl"], "parquet", VERL)
    q, a = QUESTIONS[0]
    assert len(ex) == 24
    assert ex[0].answer == a and ex[0].question == f"{q} Answer after ####."
    assert [(m.role, m.content) for m in ex[0].messages] == [("user", ex[0].question)]
    # without the keys: verl's layout is among the defaults (prompt, reward_model.ground_truth)
    plain = load_examples(user_files["verl"], "parquet")
    assert [(e.question, e.answer) for e in plain] == [(e.question, e.answer) for e in ex]


def test_trl_conversational_jsonl(user_files):
    ex = load_examples(user_files["trl"], "jsonl", RowKeys(prompt_key="prompt"))
    assert ex[3].answer == QUESTIONS[3][1]
    assert ex[3].messages[0].content == QUESTIONS[3][0]


def test_hf_datasets_folders(tmp_path, user_files):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"question": "1+1?", "answer": "#### 2"}, {"question": "2+2?", "answer": "#### 4"}]
    # load_dataset-style folder: data/<split>-xxxxx.parquet; the test split is left out
    (tmp_path / "ds" / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "ds/data/train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(rows[:1]), tmp_path / "ds/data/test-00000-of-00001.parquet")
    assert [e.answer for e in load_examples(str(tmp_path / "ds"), "hf")] == ["2", "4"]
    assert [e.answer for e in load_examples(f"{tmp_path / 'ds'}#test", "hf")] == ["2"]
    # DatasetDict.save_to_disk: <folder>/<split>/data-00000-of-00001.arrow (Arrow stream)
    (tmp_path / "dd" / "train").mkdir(parents=True)
    table = pa.Table.from_pylist(rows)
    arrow = str(tmp_path / "dd/train/data-00000-of-00001.arrow")
    with pa.OSFile(arrow, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    assert [e.question for e in load_examples(str(tmp_path / "dd"), "hf")] == ["1+1?", "2+2?"]


def test_chat_template_auto_none_and_file(user_files, tmp_path):
    tok = _tok(user_files)
    ex = load_examples(user_files["verl"], "parquet", VERL)[0]
    auto = prompt_format(TaskConfig(), tok)
    text = render(ex, tok, auto)
    assert text == f"<|im_start|>user\n{ex.question}<|im_end|>\n<|im_start|>assistant\n"
    none = prompt_format(TaskConfig(chat_template="none"), tok)
    assert render(ex, tok, none) == ex.question and none.unused
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}>")
    own = prompt_format(TaskConfig(chat_template=str(f), system_prompt="Be brief."), tok)
    sys_ex = load_examples(
        user_files["verl"], "parquet", RowKeys("prompt", "reward_model.ground_truth", "Be brief.")
    )[0]
    assert render(sys_ex, tok, own) == f"[system] Be brief.\n[user] {ex.question}\n>"
    with pytest.raises(ConfigError, match="task.chat_template"):
        prompt_format(TaskConfig(chat_template=str(tmp_path / "missing.jinja")), tok)


def test_overlong_prompts_filter_truncate_error(user_files):
    tok = _tok(user_files)
    fmt = prompt_format(TaskConfig(), tok)
    ex = load_examples(user_files["verl"], "parquet", VERL)
    # hand count: "<|im_start|>" 1 + "user\n" 5 + the question + "<|im_end|>" 1 + "\n" 1
    # + "<|im_start|>" 1 + "assistant\n" 10 (one token a byte)
    lengths = [19 + len(e.question.encode()) for e in ex]
    _, rep = render_examples(ex, tok, fmt, max_prompt_tokens=None)
    assert rep.longest == max(lengths) and rep.filtered == 0
    limit = max(lengths) - 1  # the six "... plus 400?" prompts are one token longer
    kept, rep = render_examples(ex, tok, fmt, max_prompt_tokens=limit, overlong="filter")
    assert rep.filtered == 6 and len(kept) == 18
    assert "6 longer than max_prompt_tokens" in rep.line(limit)
    cut, rep = render_examples(ex, tok, fmt, max_prompt_tokens=limit, overlong="truncate")
    assert len(cut) == len(ex) and rep.truncated == 6 and rep.filtered == 0
    longest = max(cut, key=lambda e: len(e.question))
    assert longest.rendered.endswith("<|im_start|>assistant\n")  # the end is kept
    assert len(tok(longest.rendered)["input_ids"]) <= limit
    with pytest.raises(ConfigError, match="workload.max_prompt_tokens"):
        render_examples(ex, tok, fmt, max_prompt_tokens=limit, overlong="error")


def test_fit_sets_max_prompt_tokens_unless_set(user_files, tmp_path):
    from rpeg.runtime.datasets.fit import fit_prompt_lengths

    cfg = RunConfig.from_yaml(run_yaml(user_files, tmp_path))
    said: list[str] = []
    fitted = fit_prompt_lengths(cfg, said.append)
    lengths = [19 + len(q.encode()) + len(" Answer after ####.") for q, _ in QUESTIONS[:24]]
    assert fitted.workload.max_prompt_tokens == max(lengths)
    assert "chat template applied" in said[0]
    mine = cfg.with_overrides({"workload.max_prompt_tokens": max(lengths) - 1})
    assert fit_prompt_lengths(mine, said.append).workload.max_prompt_tokens == max(lengths) - 1
    assert "filtered out" in said[-1]
    # a tokenizer's template left unused is said
    off = cfg.with_overrides({"task.chat_template": "none"})
    fit_prompt_lengths(off, said.append)
    assert any(s.startswith("warning:") and "chat template" in s for s in said)


def test_local_trainer_on_verl_data_samples_and_export(user_files, tmp_path):
    """The in-process trainer on verl data: template applied, samples.jsonl written, the last
    checkpoint exported to an HF folder whose logits equal the trainer's."""
    from transformers import AutoModelForCausalLM

    from rpeg.runtime.datasets.fit import fit_prompt_lengths
    from rpeg.runtime.export import export_checkpoint
    from rpeg.runtime.local_trainer import LocalTrainer

    cfg = fit_prompt_lengths(RunConfig.from_yaml(run_yaml(user_files, tmp_path)))
    cfg = cfg.with_overrides({"runtime.steps": 3, "runtime.log_samples_every": 2})
    trainer = LocalTrainer(cfg)
    trainer.run()
    lines = (tmp_path / "out" / "samples.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines]
    assert {r["step"] for r in rows} == {2} and len(rows) == 4  # step 2 only, all 4 rows
    assert all(r["prompt"].startswith("<|im_start|>user\n") for r in rows)
    assert all("<|im_" not in r["response"] for r in rows)  # rewards saw no template tokens
    answers = {q + " Answer after ####.": a for q, a in QUESTIONS}
    for r in rows:
        q = r["prompt"].split("\n", 1)[1].split("<|im_end|>")[0]
        assert r["reference_answer"] == answers[q]
    assert all(r["policy_version"] == 1 for r in rows)  # sampled by the weights after step 1
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "out" / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward_mean")] == [1, 2, 3]  # as the console
    out = tmp_path / "hf"
    export_checkpoint(str(tmp_path / "ckpt"), str(out), model_path=user_files["model"])
    hf = AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=False).eval()
    start = AutoModelForCausalLM.from_pretrained(
        user_files["model"], trust_remote_code=False
    ).eval()
    ids = torch.tensor([[1, 70, 71, 72, 2, 5, 9]])
    with torch.no_grad():
        mine = trainer.actor.lm(input_ids=ids).logits
        theirs = hf(input_ids=ids).logits
        before = start(input_ids=ids).logits
    assert torch.equal(mine, theirs)
    assert not torch.allclose(before, theirs)  # the trained weights, not the starting ones
