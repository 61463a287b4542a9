"""Start-up progress and the warm-up once per run (issue 41, item 1): ``rpeg train`` prints
a line within seconds of its start and then at least every few seconds until the first step;
the SFT warm-up is computed by one process and read by the others (one cache entry)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from rpeg.runtime import progress as P


def test_the_ticker_repeats_the_phase_while_nothing_is_printed():
    got: list[tuple[float, str]] = []
    t0 = time.monotonic()
    t = P.StartupTicker(echo=lambda s: got.append((time.monotonic() - t0, s)), every_s=0.2)
    t.start()
    t.phase("loading the model")
    time.sleep(0.75)
    t.echo("warm-up step 1/10: loss 2.0")  # any line counts as progress
    time.sleep(0.1)
    t.stop()
    n = len(got)
    time.sleep(0.3)
    assert len(got) == n  # stopped: silent
    lines = [s for _, s in got]
    assert lines[0] == "start-up: loading the model"
    ticks = [s for s in lines if s.startswith("start-up: loading the model (")]
    assert len(ticks) >= 2 and ticks[0].endswith("s so far)")
    gaps = [b - a for (a, _), (b, _) in zip(got, got[1:], strict=False)]
    assert max(gaps) < 0.5


def test_the_first_step_stops_the_ticker():
    got: list[str] = []
    t = P.startup_ticker(echo=got.append, every_s=0.1)
    assert P.current_ticker() is t
    t.phase("evaluating")
    bar = P.StepProgress(2, echo=got.append, bar=False)
    bar.update(1, {"reward_mean": 0.5, "step_s": 0.1})
    n = len(got)
    time.sleep(0.35)
    assert len(got) == n and P.current_ticker() is not t  # no start-up line after step 1
    bar.close()


def _tiny_source():
    from rpeg.config import RunConfig
    from rpeg.runtime.model_io import create_tiny
    from rpeg.runtime.task_data import build_task_data

    model, tok = create_tiny(seed=0)
    cursor, _ = build_task_data(RunConfig().task, tok, 32)
    return model, tok, cursor.source


def test_the_warm_up_is_computed_once_by_concurrent_processes(tmp_path, monkeypatch):
    """Two ranks asking for the same warm-up at once: one computes, the other waits and
    reads it; one cache entry, no .tmp folder left (both computed it before)."""
    from rpeg.runtime import warmup as W

    monkeypatch.setenv("RPEG_CACHE", str(tmp_path))
    computed: list[int] = []

    def slow_warmup(model, *a, **kw):  # the training itself is not what is tested here
        computed.append(1)
        time.sleep(1.0)
        return {"warmup_s": 1.0}

    monkeypatch.setattr(W, "supervised_warmup", slow_warmup)
    infos: list[dict] = []
    said: list[str] = []

    built = [_tiny_source() for _ in range(2)]  # (imports in one thread: transformers' are lazy)

    def rank(i: int) -> None:
        model, tok, source = built[i]
        _, info = W.cached_warmup(
            model,
            tok,
            source,
            {"test": "once"},
            steps=4,
            lr=1e-3,
            batch_size=2,
            template="{question}",
            seed=0,
            log=said.append,
        )
        infos.append(info)

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert sorted(i["warmup_cached"] for i in infos) == [0.0, 1.0] and computed == [1]
    entries = [p.name for p in (tmp_path / "warmup").iterdir() if p.is_dir()]
    assert len(entries) == 1 and ".tmp" not in entries[0]
    assert any("another process computes it" in s for s in said)


def test_warm_up_lines_come_by_time_not_every_50_steps(monkeypatch):
    """Slow warm-up steps (the built-in task's on a busy machine: 9.5 silent minutes) still
    print a line every WARMUP_LOG_EVERY_S seconds."""
    from rpeg.runtime import warmup as W

    monkeypatch.setattr(W, "WARMUP_LOG_EVERY_S", 0.0)
    model, tok, source = _tiny_source()
    said: list[str] = []
    W.supervised_warmup(
        model,
        tok,
        source,
        steps=3,
        lr=1e-3,
        batch_size=2,
        template="{question}",
        seed=0,
        log=said.append,
    )
    assert [s.split(":")[0] for s in said] == [f"warm-up step {i}/3" for i in (1, 2, 3)]


@pytest.mark.slow
def test_rpeg_train_local_shows_progress_from_its_start_to_the_first_step(tmp_path):
    """A line within 5 s of start, then never 10 s without one until step 1 (stdout not a
    terminal; a fresh warm-up cache, so the warm-up runs)."""
    env = dict(os.environ, RPEG_CACHE=str(tmp_path / "cache"))
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from rpeg.cli import main; sys.exit(main())"]
        + ["train", "--local", "--out", str(tmp_path / "o")]
        + ["runtime.steps=1", "optim.warmup_sft_steps=60", "workload.num_prompts=2"]
        + ["workload.samples_per_prompt=2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    stamps: list[tuple[float, str]] = []
    for line in proc.stdout:
        stamps.append((time.monotonic() - t0, line.rstrip()))
    assert proc.wait(timeout=600) == 0, stamps
    first_step = next(i for i, (_, s) in enumerate(stamps) if s.startswith("step 1/1"))
    times = [0.0] + [t for t, _ in stamps[: first_step + 1]]
    assert stamps[0][0] < 5.0, stamps[:3]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert max(gaps[1:]) < 10.0, stamps
    assert any(s.startswith("warm-up step") for _, s in stamps)
