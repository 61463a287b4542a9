"""Progress a person can follow (issue 29, item 5), the same helper on both runtimes: one line
per step when stdout is not a terminal, a bar when it is."""

from __future__ import annotations

import io

from rpeg.runtime.progress import StepProgress, step_line

M = {
    "reward_mean": 0.25,
    "accuracy": 0.5,
    "response_length": 12.0,
    "kl": 0.00123,
    "clip_frac": 0.0,
    "step_s": 1.5234,
    "tokens_per_s": 410.4,
}


def test_the_step_line():
    assert step_line(3, 10, M) == (
        "step 3/10: reward 0.250 acc 0.500 len 12.0 kl 0.0012 clip 0.000 1.52s 410 tok/s"
    )
    # what a step does not report is left out, not printed as 0
    assert step_line(1, 2, {"reward_mean": 1.0, "step_s": 0.5}) == (
        "step 1/2: reward 1.000 acc 0.000 len 0.0 0.50s"
    )


def test_one_line_per_step_without_a_terminal():
    got: list[str] = []
    p = StepProgress(2, echo=got.append, bar=False)
    p.update(1, M)
    p.update(2, M)
    p.close()
    assert [s.split(":")[0] for s in got] == ["step 1/2", "step 2/2"]


def test_nothing_when_disabled():
    got: list[str] = []
    p = StepProgress(2, enabled=False, echo=got.append, bar=False)
    p.update(1, M)
    p.close()
    assert got == [] and p.p is None


def test_a_bar_on_a_terminal_counts_from_a_resumed_step(monkeypatch):
    import sys

    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    got: list[str] = []
    p = StepProgress(4, echo=got.append, start=2)  # bar=None: stdout's isatty decides
    assert p.p is not None and p.p.tasks[0].completed == 2
    p.update(3, M)
    assert p.p.tasks[0].completed == 3 and p.p.tasks[0].fields["reward"] == 0.25
    p.close()
    assert got == []  # the bar, not lines
