"""A template ``{question:>300000000}`` passed the check and aborted the tokenizer (issue 28
low probe): the check refuses format specs and conversions, naming the field."""

from __future__ import annotations

from rpeg.runtime.data import check_template


def test_a_template_with_a_format_spec_or_conversion_is_refused_naming_it():
    got = check_template("Q: {question:>300000000} A:")
    assert [(p.where, p.what) for p in got] == [
        (
            "task.prompt_template",
            "{question:>300000000}: no format spec or conversion; write {question}",
        )
    ]
    assert check_template("{question!r}")[0].what.startswith("{question!r}:")
    assert check_template("{question:{question}}")[0].what.startswith("{question:{question}}:")
    assert check_template("Q: {question} {{literal}}") == []
