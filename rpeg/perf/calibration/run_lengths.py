"""The response and prompt lengths a run measured, kept for later predictions of the same
model and task (pure: reads and writes YAML only).

The length prior (rpeg.perf.lengths.prior_mean) is a published-run figure: thousands of
tokens for reasoning models. A run of the same model on the same task measures what it
really emits -- the built-in task's tiny model answers in ~3 tokens where the prior of a
16-token cap is ~6 and a config that leaves ``mean_prompt_tokens`` unset is priced at its
prompt cap (32, against ~6 measured). ``rpeg calibrate RUN`` stores the run's medians under
the cluster in the user's ``calibration.yaml`` (``lengths``, keyed by :func:`task_key`);
every later prediction from a run config of that model and task (``rpeg predict``, ``rpeg
bench``) that states no mean lengths of its own uses them (:func:`configured_workload`) and
lists them as an assumption. The spread of the lengths comes from the run too: the
lognormal's sigma whose expected longest response of a step's ``N`` samples equals the
run's median longest response (:func:`sigma_for_max`), or, where that longest is the cap
itself, whose share of truncated responses is the run's (:func:`sigma_for_cap_share`). docs/calibration.md, "Calibration
from a run".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rpeg.perf.lengths import LengthDist

#: where the stored lengths live inside a cluster's entry of calibration.yaml
LENGTHS_KEY = "lengths"
SIGMA_RANGE = (0.05, 3.0)


@dataclass(frozen=True)
class RunLengths:
    """What a run measured per sample (medians over its steps) and where it came from."""

    response_tokens: float
    prompt_tokens: float | None = None
    length_sigma: float | None = None  # None: the calibration's length_sigma
    source: str = ""


def task_key(config: Any) -> str:
    """The model and task a run config's lengths belong to (a run config,
    rpeg.config.RunConfig): the model, the task, its difficulty, the caps and the sampling
    temperature -- anything else (layout, cluster, algorithm) does not change what the
    policy emits."""
    m, t, w = config.model, config.task, config.workload
    task = t.kind + (f" {t.url}" if getattr(t, "url", None) else "")
    return (
        f"model={m.path or m.name}, task={task}, difficulty={t.difficulty}, "
        f"max_prompt_tokens={w.max_prompt_tokens}, max_response_tokens={w.max_response_tokens}, "
        f"temperature={w.temperature:g}"
    )


def sigma_for_max(mean: float, longest: float, n: int, cap: float) -> float | None:
    """The lognormal sigma whose ``n`` samples of mean ``mean`` (clamped at ``cap``) have
    ``longest`` as their expected maximum (:meth:`LengthDist.expected_max`); None when the
    figures say nothing (a longest at the cap: the spread is only bounded below)."""
    if not (0 < mean < longest < cap) or n < 2:
        return None
    # the expected maximum grows with sigma at a fixed mean
    return _solve_sigma(lambda s: LengthDist(mean, cap, s).expected_max(n), longest)


def sigma_for_cap_share(mean: float, share: float, cap: float) -> float | None:
    """The lognormal sigma whose samples of mean ``mean`` reach ``cap`` with probability
    ``share`` (:attr:`LengthDist.p_cap`: the run's truncated fraction) -- what says the spread
    when a step's longest response is at the cap and :func:`sigma_for_max` cannot. None when
    nothing was truncated or the mean is not below the cap; the top of :data:`SIGMA_RANGE`
    when even that spread truncates less than ``share``."""
    if not (0 < mean < cap) or not 0 < share < 1:
        return None
    # the truncated share grows with sigma at a fixed mean
    return _solve_sigma(lambda s: LengthDist(mean, cap, s).p_cap, share)


def _solve_sigma(grows: Callable[[float], float], target: float) -> float:
    """The sigma in :data:`SIGMA_RANGE` where ``grows`` (increasing in sigma) reaches
    ``target``, by bisection; an end of the range when the target lies beyond it."""
    lo, hi = SIGMA_RANGE
    if grows(lo) >= target:
        return lo
    if grows(hi) <= target:
        return hi
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if grows(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def with_lengths(workload: Any, lengths: RunLengths, *, prompt: bool, response: bool) -> Any:
    """``workload`` with the measured mean response (``response``) and prompt (``prompt``)
    lengths and spread in place, and the assumption that says so."""
    change: dict[str, Any] = {}
    if response:
        change["mean_response_tokens"] = lengths.response_tokens
        if lengths.length_sigma is not None:
            change["length_sigma"] = lengths.length_sigma
    if prompt and lengths.prompt_tokens:
        change["mean_prompt_tokens"] = lengths.prompt_tokens
    if not change:
        return workload
    said = [f"{lengths.response_tokens:.3g} response tokens"] if response else []
    if "mean_prompt_tokens" in change:
        said.append(f"{lengths.prompt_tokens:.3g} prompt tokens")
    if "length_sigma" in change:
        said.append(f"length sigma {lengths.length_sigma:.2f}")
    note = f"lengths measured by rpeg calibrate on {lengths.source}: {', '.join(said)}"
    return replace(workload, **change, assumed=(*workload.assumed, note))


def configured_workload(config: Any, cluster: str | None = None) -> Any:
    """The :class:`rpeg.perf.prediction.Workload` of a run config: its own lengths where it
    states them, else the lengths ``rpeg calibrate`` measured for its model and task on
    ``cluster`` (default: the config's plan cluster), else the prior's. A multi-turn task's
    lengths are its turn shape's: the one ``rpeg calibrate`` measured for it where its
    config states none (:func:`rpeg.perf.calibration.turn_store.with_stored_turns`)."""
    from rpeg.perf.prediction import Workload

    w = config.workload
    wl = Workload.from_config(w, config.model.lora, config.task.multiturn)
    name = cluster or getattr(config.plan, "cluster", None) or config.cluster.name
    if wl.turns is not None:  # multi-turn: the turn shape measured for it, if any
        from rpeg.perf.calibration.turn_store import with_stored_turns

        return with_stored_turns(wl, config, name, task_key(config))
    if w.mean_response_tokens and w.mean_prompt_tokens:
        return wl
    found = lookup(name, task_key(config))
    if found is None:
        return wl
    return with_lengths(
        wl,
        found,
        prompt=not w.mean_prompt_tokens,
        response=not w.mean_response_tokens,
    )


def _entry(cluster: str, path: Path | None) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    import yaml

    from rpeg.perf.calibration import user_calibration_file

    path = path or user_calibration_file()
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    data = data if isinstance(data, dict) else {}
    clusters = data.setdefault("clusters", {})
    entry = clusters.get(cluster)
    if not isinstance(entry, dict):
        entry = clusters[cluster] = {}
    return path, data, entry


def store(cluster: str, key: str, lengths: RunLengths, path: Path | None = None) -> Path:
    """Keep ``lengths`` for ``key`` under ``cluster`` in the user's calibration.yaml (the
    cluster's fitted values and other tasks' lengths kept)."""
    import yaml

    path, data, entry = _entry(cluster, path)
    row: dict[str, Any] = {"response_tokens": round(float(lengths.response_tokens), 4)}
    if lengths.prompt_tokens:
        row["prompt_tokens"] = round(float(lengths.prompt_tokens), 4)
    if lengths.length_sigma is not None:
        row["length_sigma"] = round(float(lengths.length_sigma), 4)
    row["source"] = lengths.source
    entry.setdefault(LENGTHS_KEY, {})[key] = row
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def lookup(cluster: str, key: str, path: Path | None = None) -> RunLengths | None:
    """The lengths stored for ``key`` under ``cluster``; None when there are none."""
    from rpeg.perf.calibration import user_calibration_file

    path = path or user_calibration_file()
    if not path.is_file():
        return None
    _, _, entry = _entry(cluster, path)
    row = (entry.get(LENGTHS_KEY) or {}).get(key)
    if not isinstance(row, dict) or not isinstance(row.get("response_tokens"), (int, float)):
        return None

    def num(k: str) -> float | None:
        v = row.get(k)
        return float(v) if isinstance(v, (int, float)) else None

    return RunLengths(
        response_tokens=float(row["response_tokens"]),
        prompt_tokens=num("prompt_tokens"),
        length_sigma=num("length_sigma"),
        source=str(row.get("source", "")),
    )
