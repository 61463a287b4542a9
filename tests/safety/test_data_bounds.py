"""Issue 44, items 3, 4, 9, 10 and 13: lengths and data are bounded before anything is
allocated. A length derived from the data never runs past the model's context; a response
cap over the context is refused; data files are read with a size bound (``/dev/zero``
refused at once); a corrupt parquet names its file; a null column is named as null; a file of
empty prompts is refused; absurd workload sizes are refused by the config."""

from __future__ import annotations

import json
import time

import pytest

from rpeg.config import RunConfig
from rpeg.errors import ConfigError
from rpeg.runtime.datasets.files import check_examples, load_row_texts
from rpeg.runtime.datasets.fit import fit_prompt_lengths, model_context


def _jsonl(path, questions):
    with open(path, "w") as fh:
        for i, q in enumerate(questions):
            fh.write(json.dumps({"question": q, "answer": str(i)}) + "\n")
    return str(path)


def _cfg(url, **over):
    return RunConfig().with_overrides({"task.kind": "jsonl", "task.url": url, **over})


def _long_data(tmp_path):
    # 3 of 24 prompts at 20,000 characters: the char tokenizer makes each 20,000+ tokens
    qs = ["x" * 20_000 if i in (2, 11, 19) else f"What is {i} plus 1?" for i in range(24)]
    return _jsonl(tmp_path / "long.jsonl", qs)


def test_a_limit_fitted_to_the_data_stays_within_the_context(tmp_path):
    cfg = _cfg(_long_data(tmp_path))
    ctx = model_context(cfg)
    lines: list[str] = []
    fitted = fit_prompt_lengths(cfg, log=lines.append)
    assert fitted.workload.max_prompt_tokens + fitted.workload.max_response_tokens <= ctx
    assert "3 longer than" in lines[-1] and "filtered out" in lines[-1]


def test_overlong_error_refuses_naming_the_context(tmp_path):
    cfg = _cfg(_long_data(tmp_path), **{"task.overlong": "error"})
    with pytest.raises(ConfigError, match="3 of 24 prompts .* model's context") as got:
        fit_prompt_lengths(cfg)
    assert "task.overlong" in str(got.value)


def test_overlong_truncate_cuts_to_the_context(tmp_path):
    cfg = _cfg(_long_data(tmp_path), **{"task.overlong": "truncate"})
    fitted = fit_prompt_lengths(cfg)
    assert fitted.workload.max_prompt_tokens == model_context(cfg) - 16  # response cap: 16


def test_a_response_cap_over_the_context_is_refused(tmp_path):
    cfg = RunConfig().with_overrides({"workload.max_response_tokens": 100_000})
    with pytest.raises(ConfigError, match="workload.max_response_tokens.*context of 256"):
        fit_prompt_lengths(cfg)


def test_the_planner_refuses_a_response_cap_over_the_models_context():
    from rpeg.search.problem import problem_from_config

    cfg = RunConfig().with_overrides({"workload.max_response_tokens": 1_000_000})
    with pytest.raises(ConfigError, match="workload.max_response_tokens.*context"):
        problem_from_config(cfg)


def test_absurd_workload_sizes_are_refused_by_the_config():
    with pytest.raises(ConfigError, match="workload.max_response_tokens"):
        RunConfig().with_overrides({"workload.max_response_tokens": 10**9})
    with pytest.raises(ConfigError, match="num_prompts\\*samples_per_prompt"):
        RunConfig().with_overrides(
            {"workload.num_prompts": 10**9, "workload.samples_per_prompt": 10**9}
        )


def test_dev_zero_is_refused_at_once():
    t0 = time.monotonic()
    (p,) = check_examples("/dev/zero", "jsonl")
    assert time.monotonic() - t0 < 5
    assert p.where == "task.url" and "not a regular file" in p.what
    with pytest.raises(ConfigError, match="/dev/zero"):
        load_row_texts("/dev/zero", "jsonl")


def test_a_data_file_over_the_size_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("rpeg.runtime.datasets.files.MAX_DATA_BYTES", 100)
    url = _jsonl(tmp_path / "big.jsonl", ["q" * 200])
    (p,) = check_examples(url, "jsonl")
    assert "read up to 100 bytes" in p.what and url in p.what


def test_an_overlong_json_line_is_a_row_problem(tmp_path, monkeypatch):
    monkeypatch.setattr("rpeg.runtime.datasets.files.MAX_LINE_CHARS", 50)
    url = _jsonl(tmp_path / "d.jsonl", ["short", "y" * 200, "fine"])
    probs = check_examples(url, "jsonl")
    assert [p.where for p in probs] == [f"{url}:2"]
    assert "longer than 50 characters" in probs[0].what


def test_a_corrupt_parquet_names_the_file(tmp_path):
    bad = tmp_path / "train.parquet"
    bad.write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1")
    (p,) = check_examples(str(bad), "parquet")
    assert str(bad) in p.what and "not a readable parquet file" in p.what
    with pytest.raises(ConfigError, match="train.parquet"):
        load_row_texts(str(bad), "parquet")


def test_a_null_column_is_named_as_null_not_missing(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    url = str(tmp_path / "n.parquet")
    pq.write_table(pa.table({"question": [None, None], "answer": ["1", "2"]}), url)
    probs = check_examples(url, "parquet")
    assert len(probs) == 2 and all("'question' is null" in p.what for p in probs)


def test_a_file_of_empty_prompts_is_refused(tmp_path):
    url = _jsonl(tmp_path / "e.jsonl", ["", "  ", "\n"])
    (p,) = check_examples(url, "jsonl")
    assert p.where == "task.url" and "all 3 prompts" in p.what and "empty" in p.what


def test_a_line_that_is_not_utf8_is_named_with_its_byte(tmp_path):
    """A Latin-1 line was a bare UnicodeDecodeError naming neither file nor line."""
    url = str(tmp_path / "latin.jsonl")
    good = b'{"question": "1+1", "answer": "2"}\n'
    with open(url, "wb") as fh:
        fh.write(good + b'{"question": "caf\xe9 1+1", "answer": "2"}\n' + good)
    probs = check_examples(url, "jsonl")
    assert [p.where for p in probs] == [f"{url}:2"]
    assert "not UTF-8" in probs[0].what and "0xe9" in probs[0].what


def test_a_byte_order_mark_is_not_part_of_the_first_row(tmp_path):
    url = str(tmp_path / "bom.jsonl")
    with open(url, "wb") as fh:
        fh.write(b"\xef\xbb\xbf" + b'{"question": "1+1", "answer": "2"}\n' * 3)
    assert check_examples(url, "jsonl") == []
    assert [t.answer for t in load_row_texts(url, "jsonl")] == ["2"] * 3


def test_verl_rows_read_without_keys_and_a_missing_answer_names_where_it_was_looked_for(tmp_path):
    rows = [
        {"prompt": [{"role": "user", "content": "1+1?"}], "reward_model": {"ground_truth": "2"}}
    ]
    url = str(tmp_path / "verl.jsonl")
    (tmp_path / "verl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert check_examples(url, "jsonl") == []
    assert [(t.question, t.answer) for t in load_row_texts(url, "jsonl")] == [("1+1?", "2")]
    url = str(tmp_path / "q.jsonl")
    (tmp_path / "q.jsonl").write_text(json.dumps({"question": "1+1?"}) + "\n")
    (p,) = check_examples(url, "jsonl")
    assert "no reference answer" in p.what and "reward_model.ground_truth" in p.what
    assert "prompt" not in p.what.split("(")[0]  # the prompt was found
