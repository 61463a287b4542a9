"""The turn shape a multi-turn run measured, kept for later predictions of the same model
and task (pure: reads and writes YAML only). docs/multiturn.md "Fitting the turn shape
from a run".

``rpeg calibrate RUN`` of a multi-turn run fits ``mean_turns``, ``mean_turn_tokens``,
``observation_tokens`` and ``env_latency_s`` (:mod:`rpeg.perf.calibration.turn_fit`) and stores them in
the user's ``calibration.yaml`` under the run's cluster (``turns``, keyed by
:func:`turn_key`: the model and task as :func:`rpeg.perf.calibration.run_lengths.task_key` says, and the
environment, its tools and the turn caps), beside the response lengths a single-turn run
keeps (:mod:`rpeg.perf.calibration.run_lengths`). A later prediction from a run config of that model
and task takes each value the config's ``task.multiturn`` does not state (left unset or at
its default: :func:`with_stored_turns`) and lists it as an assumption; a value the config
states wins.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

#: where the stored turn shapes live inside a cluster's entry of calibration.yaml
TURNS_KEY = "turns"
#: the task.multiturn fields a stored shape supplies
FIELDS = ("mean_turns", "mean_turn_tokens", "observation_tokens", "env_latency_s")


@dataclass(frozen=True)
class StoredTurns:
    """A run's fitted turn shape and where it came from."""

    mean_turns: float
    observation_tokens: float
    env_latency_s: float
    mean_turn_tokens: float | None = None
    prompt_tokens: float | None = None  # the run's mean prompt (workload.mean_prompt_tokens)
    # the run's mean transcript (workload.mean_response_tokens: what the trainer's passes
    # see; shorter than the turns' tokens by the tails generated after a tool call's close)
    response_tokens: float | None = None
    source: str = ""


def turn_key(config: Any, task: str) -> str:
    """The model and task a multi-turn run config's turn shape belongs to: ``task``, the
    key of its lengths (:func:`rpeg.perf.calibration.run_lengths.task_key`: model, task, difficulty,
    caps, temperature), and the environment, its tools and the turn caps (what the policy
    does with them); not the layout, the cluster, the algorithm or ``env_concurrency``
    (which changes the waves, not a call's latency)."""
    mt = config.task.multiturn
    return (
        f"{task}, env={mt.env}, tools={'+'.join(mt.tools)}, "
        f"max_turns={mt.max_turns}, max_turn_tokens={mt.max_turn_tokens}"
    )


def _load(path: Path) -> dict[str, Any]:
    import yaml

    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    return data if isinstance(data, dict) else {}


def _user(path: Path | None) -> Path:
    from rpeg.perf.calibration import user_calibration_file

    return path or user_calibration_file()


def store(cluster: str, key: str, turns: StoredTurns, path: Path | None = None) -> Path:
    """Keep ``turns`` for ``key`` under ``cluster`` in the user's calibration.yaml (the
    cluster's fitted values, its lengths and other tasks' shapes kept)."""
    import yaml

    path = _user(path)
    data = _load(path)
    clusters = data.setdefault("clusters", {})
    entry = clusters.get(cluster)
    if not isinstance(entry, dict):
        entry = clusters[cluster] = {}
    row: dict[str, Any] = {
        k: round(float(v), 6)
        for k in (*FIELDS, "prompt_tokens", "response_tokens")
        if (v := getattr(turns, k)) is not None
    }
    row["source"] = turns.source
    entry.setdefault(TURNS_KEY, {})[key] = row
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def lookup(cluster: str, key: str, path: Path | None = None) -> StoredTurns | None:
    """The turn shape stored for ``key`` under ``cluster``; None when there is none (or an
    entry lacks a number it needs)."""
    entry = (_load(_user(path)).get("clusters") or {}).get(cluster)
    row = ((entry or {}).get(TURNS_KEY) or {}).get(key) if isinstance(entry, dict) else None
    if not isinstance(row, dict):
        return None

    def num(k: str) -> float | None:
        v = row.get(k)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    need = [num(k) for k in ("mean_turns", "observation_tokens", "env_latency_s")]
    if any(v is None for v in need):
        return None
    return StoredTurns(
        mean_turns=need[0],
        observation_tokens=need[1],
        env_latency_s=need[2],
        mean_turn_tokens=num("mean_turn_tokens"),
        prompt_tokens=num("prompt_tokens"),
        response_tokens=num("response_tokens"),
        source=str(row.get("source", "")),
    )


def _states(section: Any, name: str) -> bool:
    """Whether a task.multiturn section states ``name``: a value other than the field's
    default (None for the means; 16 observation tokens, 0.01 s), so that a config written
    out whole (``rpeg config``) states only what differs."""
    field = type(section).model_fields.get(name)
    value = getattr(section, name)
    return value is not None and (field is None or value != field.default)


def with_stored_turns(
    workload: Any, config: Any, cluster: str, task: str, path: Path | None = None
) -> Any:
    """``workload`` (a multi-turn :class:`rpeg.perf.prediction.Workload` of ``config``) with
    the turn shape ``rpeg calibrate`` stored for its model and task (``task``: its length
    key, :func:`turn_key`) on ``cluster`` in place
    of every value ``config.task.multiturn`` does not state (and the run's mean prompt and
    transcript where ``workload.mean_prompt_tokens`` / ``mean_response_tokens`` are unset),
    and the assumption that says so; ``workload`` itself when it is single-turn, nothing is stored, or all are stated."""
    if workload.turns is None:
        return workload
    found = lookup(cluster, turn_key(config, task), path)
    if found is None:
        return workload
    mt = config.task.multiturn
    t = workload.turns
    change: dict[str, float] = {}
    for k in FIELDS:
        v = getattr(found, k)
        if v is not None and not _states(mt, k):
            change[k] = v
    if "mean_turns" in change:
        change["mean_turns"] = min(max(change["mean_turns"], 1.0), float(t.max_turns))
    if "mean_turn_tokens" in change:
        change["mean_turn_tokens"] = min(change["mean_turn_tokens"], float(t.max_turn_tokens))
    w = config.workload
    lengths = {
        "mean_prompt_tokens": (found.prompt_tokens, w.mean_prompt_tokens, "prompt"),
        "mean_response_tokens": (found.response_tokens, w.mean_response_tokens, "transcript"),
    }
    more = {k: v for k, (v, own, _) in lengths.items() if v is not None and not own}
    if not change and not more:
        return workload
    said = [f"{k} {v:.4g}" for k, v in change.items()]
    said += [f"{v:.4g} {lengths[k][2]} tokens" for k, v in more.items()]
    note = f"turn shape measured by rpeg calibrate on {found.source}: {', '.join(said)}"
    return replace(workload, turns=replace(t, **change), assumed=(*workload.assumed, note), **more)
