"""Data probes of issue 28 (the template one: test_template_spec.py): a deeply nested JSON
line ended in a bare RecursionError; a data set whose answers are all empty trained on reward 0 silently; a one-row data set printed
``nan -> nan`` (its message: tests/runtime/test_summary_resume.py)."""

from __future__ import annotations

import json

from rpeg.config import RunConfig
from rpeg.runtime.datasets.files import check_examples
from rpeg.runtime.datasets.fit import fit_prompt_lengths


def test_a_deeply_nested_json_line_is_a_named_row_problem(tmp_path):
    path = tmp_path / "deep.jsonl"
    deep = "[" * 100_000 + "]" * 100_000
    path.write_text(
        json.dumps({"question": "1+1=", "answer": "2"}) + "\n" + f'{{"question": {deep}}}\n'
    )
    got = check_examples(str(path))
    assert [(p.where, p.what) for p in got] == [
        (f"{path}:2", "JSON nested too deeply to read (Python's recursion limit)")
    ]


def _cfg(path):
    return RunConfig.from_dict(
        {"task": {"kind": "jsonl", "url": str(path)}, "runtime": {"output_dir": "unused"}}
    )


def test_all_empty_answers_are_warned_about(tmp_path):
    path = tmp_path / "empty.jsonl"
    rows = [{"question": f"{i}+1=", "answer": ""} for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    said: list[str] = []
    fit_prompt_lengths(_cfg(path), log=said.append)
    warn = [s for s in said if "empty answer" in s]
    assert warn == [
        f"warning: 3 of 3 rows of {path} have an empty answer ('answer'); rewards that "
        "compare to it score 0 on those rows: the run would train on nothing"
    ]


def test_a_one_row_data_set_says_nothing_is_held_out(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"question": "1+1=", "answer": "2"}) + "\n")
    said: list[str] = []
    fit_prompt_lengths(_cfg(path), log=said.append)
    assert f"warning: {path} holds 1 row: nothing is held out" in " ".join(said)
