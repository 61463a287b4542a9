"""A run's progress artifact and samples table are updated at most every
``ARTIFACT_EVERY_S`` seconds (each update is a Prefect API call the server answers with a
database write; on a short-step run they took CPU from the ranks), while every step writes its
log line; the first and the last step always update them, and a run that ends early updates
them to its newest step when the sink closes."""

from __future__ import annotations

from rpeg.runtime.step.messages import Record


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _sink(tmp_path, monkeypatch, steps: int):
    from rpeg.flows import step_sink

    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(
        step_sink, "publish_guarded", lambda fn, *a, **k: calls.append((fn, a[0] if a else -1))
    )
    clock = _Clock()
    monkeypatch.setattr(step_sink.time, "monotonic", clock)
    sink = step_sink.StepSink(tmp_path, steps=steps, progress=False, checkpoint_url=lambda s: None)
    return sink, calls, clock, step_sink.ARTIFACT_EVERY_S


def _record(sink, history, s):
    history[s] = {"step": s, "reward_mean": 0.1 * s}
    sink.record(Record(s, history[s]), history)
    sink._writer.submit(lambda: None).result()  # the writer thread is done with it


def test_artifacts_are_updated_every_interval_and_every_step_is_logged(tmp_path, monkeypatch):
    sink, calls, clock, every = _sink(tmp_path, monkeypatch, steps=10)
    history: dict = {}
    for s in range(10):
        _record(sink, history, s)
        clock.t += every * 0.3  # a step: under a third of the interval
    sink.close()
    published = [n for fn, n in calls if fn == "publish_step"]
    logged = [n for fn, n in calls if fn == "log_step"]
    # the first step, then whenever the interval has passed (every 4th step), and the last
    assert published == [1, 5, 9, 10]
    assert sorted(published + logged) == list(range(1, 11))  # one line per step, no twice


def test_a_run_that_ends_early_brings_the_artifacts_to_its_newest_step(tmp_path, monkeypatch):
    sink, calls, clock, every = _sink(tmp_path, monkeypatch, steps=100)
    history: dict = {}
    for s in range(3):
        _record(sink, history, s)
        clock.t += every * 0.1
    assert [n for fn, n in calls if fn == "publish_step"] == [1]
    sink.close()
    assert [n for fn, n in calls if fn == "publish_step"] == [1, 3]


def test_long_steps_update_every_step(tmp_path, monkeypatch):
    sink, calls, clock, every = _sink(tmp_path, monkeypatch, steps=5)
    history: dict = {}
    for s in range(5):
        _record(sink, history, s)
        clock.t += every * 2  # a GPU step: longer than the interval
    sink.close()
    assert [n for fn, n in calls if fn == "publish_step"] == [1, 2, 3, 4, 5]
    assert not [n for fn, n in calls if fn == "log_step"]
