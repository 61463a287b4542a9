"""Checkpoints are data, belong to one run, and fail as what they are."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from rpeg.config import RunConfig
from rpeg.errors import ConfigError
from rpeg.runtime.actors.checkpoint import (
    COMMIT,
    CheckpointError,
    CheckpointStore,
    CheckpointWriteError,
    check_resumable,
    dumps,
    loads,
    resolve_run_id,
)


class _Payload:
    """Unpickling this runs a command (the classic pickle payload)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _craft(step_dir: Path, parts: dict[str, bytes], fmt: int = 2, run_id: str | None = None):
    """Write ``parts`` and a COMMIT whose checksums match (what an attacker can do)."""
    step_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, data in parts.items():
        (step_dir / name).write_bytes(data)
        files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    step = int(step_dir.name.split("-")[1])
    meta = {"format": fmt, "step": step, "run_id": run_id, "files": files}
    (step_dir / COMMIT).write_text(json.dumps(meta))


def _cfg(tmp_path: Path, **over) -> RunConfig:
    base = {
        "workload.num_prompts": 2,
        "workload.samples_per_prompt": 2,
        "workload.max_response_tokens": 4,
        "workload.micro_batch_size": 4,
        "workload.train_minibatches": 1,
        "task.heldout_size": 4,
        "model.tiny_shape": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1},
        "optim.warmup_sft_steps": 0,
        "runtime.steps": 4,
        "runtime.checkpoint_every": 2,
        "runtime.checkpoint_url": str(tmp_path / "ck"),
        "runtime.output_dir": str(tmp_path / "out"),
    }
    base.update(over)
    return RunConfig().with_overrides(base)


# ------------------------------------------------------------------------ files are data
def test_crafted_pickle_checkpoint_runs_nothing_on_resume(tmp_path):
    """A driver.pt / trainer.pt pickle with a matching COMMIT ran its payload on --resume
    (torch.load(weights_only=False)); now it is refused as not a state file."""
    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Payload(marker))
    run = "run-victim"
    d = tmp_path / "ck" / run / "step-00000002"
    _craft(d, {"trainer.pt": evil, "driver.pt": evil}, run_id=run)
    store = CheckpointStore(str(tmp_path / "ck"), run_id=run)
    meta, parts = store.latest()  # the checksums match: the store hands the bytes over
    with pytest.raises(CheckpointError, match="refused"):
        loads(parts["driver.pt"])
    # the real resume path of `rpeg train --local --resume`
    from rpeg.runtime.local_trainer import LocalTrainer

    cfg = _cfg(tmp_path, **{"runtime.resume": True, "runtime.run_id": run})
    with pytest.raises(CheckpointError, match="refused"):
        LocalTrainer(cfg).run()
    # an old (format 1) pickle checkpoint is skipped without being read as a pickle
    d1 = tmp_path / "old" / "step-00000004"
    _craft(d1, {"driver.pt": evil}, fmt=1)
    with pytest.warns(RuntimeWarning, match="format 1"):
        assert CheckpointStore(str(tmp_path / "old")).latest() is None
    assert not marker.exists()


def test_state_file_round_trip_is_exact_and_data_only():
    import random

    m = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.randn(4, 3)).sum().backward()
    opt.step()
    state = {
        "w": m.state_dict(),
        "bf16": torch.randn(5, dtype=torch.bfloat16),
        "opt": opt.state_dict(),
        "rng": torch.get_rng_state(),
        "py": random.getstate(),
        "steps": {3: (1, 2.5, float("inf"))},
        "raw": b"\x00\x01",
    }
    back = loads(dumps(state))
    assert torch.equal(back["bf16"], state["bf16"]) and back["bf16"].dtype == torch.bfloat16
    assert all(torch.equal(back["w"][k], v) for k, v in state["w"].items())
    assert back["py"] == state["py"] and back["steps"] == state["steps"]
    assert back["raw"] == b"\x00\x01" and torch.equal(back["rng"], state["rng"])
    opt.load_state_dict(back["opt"])  # a real optimizer accepts it
    with pytest.raises(TypeError, match="data only"):
        dumps({"f": open})  # arbitrary objects are not stored


def test_no_full_pickle_loads_in_rpeg():
    root = Path(__file__).resolve().parents[2] / "rpeg"
    bad = [
        str(p.relative_to(root.parent))
        for p in root.rglob("*.py")
        if "weights_only=False" in p.read_text() or "pickle.load" in p.read_text()
    ]
    assert bad == []


# ------------------------------------------------------------------------ runs own checkpoints
def test_two_runs_sharing_a_folder_keep_each_others_checkpoints(tmp_path):
    url = str(tmp_path / "ck")
    old = CheckpointStore(url, keep_last=3, run_id="run-old")
    for s in (8, 10, 12):
        old.save(s, {"a.pt": dumps({"s": s})})
    new = CheckpointStore(url, keep_last=3, run_id="run-new")
    for s in (2, 4, 6, 8):
        new.save(s, {"a.pt": dumps({"s": s})})
    assert old.complete_steps() == [8, 10, 12]
    assert new.complete_steps() == [4, 6, 8]
    assert loads(new.latest()[1]["a.pt"]) == {"s": 8}
    assert loads(old.latest()[1]["a.pt"]) == {"s": 12}
    # --resume with two runs in the folder names both instead of picking one
    rt = RunConfig().runtime.model_copy(update={"checkpoint_url": url, "resume": True})
    with pytest.raises(ConfigError, match="run-new.*run-old|run-old.*run-new"):
        resolve_run_id(rt)
    assert resolve_run_id(rt.model_copy(update={"run_id": "run-old"})) == "run-old"


def test_resume_with_nothing_usable_is_an_error_listing_what_was_found(tmp_path):
    url = str(tmp_path / "ck")
    st = CheckpointStore(url, run_id="run-a")
    st.save(2, {"a.pt": dumps({"s": 2})})
    (tmp_path / "ck" / "run-a" / "step-00000002" / "a.pt").write_bytes(b"garbage!")  # corrupt
    (tmp_path / "ck" / "run-a" / "step-00000004").mkdir()  # partial
    rt = RunConfig().runtime.model_copy(update={"checkpoint_url": url, "resume": True})
    problems = check_resumable(rt)
    assert len(problems) == 1
    text = str(problems[0])
    assert "step 2 corrupt" in text and "step 4 partial" in text
    with pytest.raises(ConfigError, match="step 2 corrupt"):
        CheckpointStore.for_run(rt)
    # a same-size corruption passes the cheap pre-check; the checksums catch it at restore
    # time and the store refuses to silently start at step 0
    good = dumps({"s": 2})
    st.save(2, {"a.pt": good})
    (tmp_path / "ck" / "run-a" / "step-00000002" / "a.pt").write_bytes(b"\0" * len(good))
    assert check_resumable(rt) == []
    with pytest.warns(RuntimeWarning), pytest.raises(CheckpointError, match="nothing usable"):
        CheckpointStore.for_run(rt).latest()
    empty = rt.model_copy(update={"checkpoint_url": str(tmp_path / "none")})
    assert "found: nothing" in str(check_resumable(empty)[0])


def test_resume_from_another_runs_checkpoint(tmp_path):
    src = CheckpointStore(str(tmp_path / "a"), run_id="run-src")
    src.save(6, {"a.pt": dumps({"s": 6})})
    rt = RunConfig().runtime.model_copy(
        update={"checkpoint_url": str(tmp_path / "b"), "resume_from": src.step_url(6)}
    )
    assert check_resumable(rt) == []
    st = CheckpointStore.for_run(rt)
    assert st.run_id != "run-src" and loads(st.latest()[1]["a.pt"]) == {"s": 6}
    st.save(8, {"a.pt": dumps({"s": 8})})
    assert loads(st.latest()[1]["a.pt"]) == {"s": 8}  # its own, once it has one


# ------------------------------------------------------------------------ write failures
@pytest.mark.parametrize(
    "err,reason",
    [(errno.ENOSPC, "disk_full"), (errno.EACCES, "permission"), (errno.EROFS, "permission")],
)
def test_write_failure_is_typed_and_leaves_no_partial(tmp_path, monkeypatch, err, reason):
    st = CheckpointStore(str(tmp_path / "ck"), run_id="run-w")
    st.save(2, {"a.pt": dumps({"s": 2})})
    real_open = st.fs.open
    calls = {"n": 0}

    def failing_open(path, mode="rb", **kw):
        if "w" in mode and "step-00000004" in path:
            calls["n"] += 1
            if calls["n"] == 2:  # the second part: the first is already on disk
                raise OSError(err, os.strerror(err), path)
        return real_open(path, mode, **kw)

    monkeypatch.setattr(st.fs, "open", failing_open)
    with pytest.raises(CheckpointWriteError) as ei:
        st.save(4, {"a.pt": b"x" * 1000, "b.pt": b"y" * 1000})
    assert ei.value.reason == reason
    assert not (tmp_path / "ck" / "run-w" / "step-00000004").exists()
    assert st.complete_steps() == [2]
    # pickled across the Dask boundary it stays what it is
    again = pickle.loads(pickle.dumps(ei.value))
    assert isinstance(again, CheckpointWriteError) and again.reason == reason


def test_a_write_error_is_not_a_lost_worker():
    from rpeg.runtime.actors.failures import classify

    e = CheckpointWriteError("checkpoint step 4 not written: disk full: Connection", "disk_full")
    assert classify(e) is None  # raised as it is: no actor restarts, no recovery
    assert classify(OSError(errno.ENOSPC, "No space left on device")) is None


# ------------------------------------------------------------------------ local trainer
def test_local_trainer_checkpoints_and_resumes_to_the_same_result(tmp_path):
    from rpeg.runtime.local_trainer import LocalTrainer

    full = _cfg(tmp_path / "full", **{"runtime.run_id": "run-full"})
    LocalTrainer(full).run()
    ref = [json.loads(x) for x in (tmp_path / "full/out/metrics.jsonl").read_text().splitlines()]
    assert CheckpointStore(str(tmp_path / "full/ck"), run_id="run-full").complete_steps() == [2, 4]

    half = _cfg(tmp_path / "half", **{"runtime.steps": 2})
    LocalTrainer(half).run()
    resumed = _cfg(tmp_path / "half", **{"runtime.resume": True})
    LocalTrainer(resumed).run()
    got = [json.loads(x) for x in (tmp_path / "half/out/metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in got] == [1, 2, 3, 4]
    for key in ("reward_mean", "loss", "response_length"):
        if key in ref[0]:
            assert [m[key] for m in got] == [m[key] for m in ref], key


def test_unique_run_ids():
    from rpeg.runtime.actors.checkpoint import new_run_id

    ids = {new_run_id() for _ in range(50)}
    assert len(ids) == 50 and all(i.startswith("run-") for i in ids)


def test_a_crafted_state_tree_cannot_name_other_classes():
    from safetensors.torch import save

    from rpeg.runtime.actors.state_file import StateFileError

    for ref in ("subprocess:Popen", "os:system", "rpeg.cli:main", "rpeg.runtime.rewards:RewardSet"):
        tree = {"__dataclass__": ref, "fields": {"args": ["touch", "/tmp/x"]}}
        data = save({}, metadata={"format": "rpeg-state", "rpeg_tree": json.dumps(tree)})
        with pytest.raises(StateFileError, match="refusing|unknown"):
            from rpeg.runtime.actors.state_file import loads as raw_loads

            raw_loads(data)


def test_resume_refuses_another_models_checkpoint_and_the_other_runtimes_parts(tmp_path):
    """Checked before anything starts: a checkpoint records the model it holds (its folders
    and the built-in shape); resuming it with another model, or with the runtime that did not
    write it, names the difference -- it used to fail after the model was built (and for
    the tiny model warmed up) with torch's list of unexpected state-dict keys."""
    from rpeg.runtime.actors.checkpoint_identity import TRAINER_PART, model_identity

    url = str(tmp_path / "ck")
    four = RunConfig().model
    two = four.model_copy(update={"tiny_shape": {"num_hidden_layers": 2}})
    st = CheckpointStore(url, run_id="run-a")
    st.save(2, {"g0-rank0.pt": dumps({}), "driver.pt": dumps({})}, {"model": model_identity(four)})
    rt = RunConfig().runtime.model_copy(update={"checkpoint_url": url, "resume": True})
    assert check_resumable(rt, four, local=False) == []
    problems = check_resumable(rt, two, local=False)
    assert [p.where for p in problems] == ["model"]
    assert "policy tiny_shape={} (this config: {'num_hidden_layers': 2})" in problems[0].what
    assert [p.where for p in check_resumable(rt, four, local=True)] == ["--local"]
    # a single-process trainer's checkpoint, resumed by the distributed runtime
    st.save(4, {TRAINER_PART: dumps({})}, {"model": model_identity(four)})
    assert check_resumable(rt, four, local=True) == []
    assert [p.where for p in check_resumable(rt, four, local=False)] == ["--resume"]
    # --resume-from a step folder is checked the same way; a marker without a model passes
    rf = rt.model_copy(update={"resume": False, "resume_from": st.step_url(4)})
    assert [p.where for p in check_resumable(rf, two, local=True)] == ["model"]
    st.save(6, {TRAINER_PART: dumps({})})
    assert check_resumable(rt, two, local=True) == []


def test_a_moved_model_folder_resumes_another_architecture_does_not(tmp_path):
    """The marker records a model folder's architecture (its config.json), not its path."""
    from rpeg.runtime.actors.checkpoint_identity import model_identity

    def folder(name, layers):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(
            json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": layers})
        )
        return str(d)

    base = RunConfig().model
    a = base.model_copy(update={"path": folder("a", 4)})
    moved = base.model_copy(update={"path": folder("b", 4)})
    other = base.model_copy(update={"path": folder("c", 2)})
    url = str(tmp_path / "ck")
    CheckpointStore(url, run_id="run-a").save(2, {"x.pt": dumps({})}, {"model": model_identity(a)})
    rt = RunConfig().runtime.model_copy(update={"checkpoint_url": url, "resume": True})
    assert check_resumable(rt, moved) == []
    (p,) = check_resumable(rt, other)
    assert p.where == "model" and "policy num_hidden_layers=4 (this config: 2)" in p.what


def test_a_state_file_from_before_the_step_package_moved_still_loads():
    """Checkpoints written when the staleness buffer lived in rpeg.runtime.actors name its
    classes there; they resume (rpeg.runtime.actors.state_file.MOVED_MODULES)."""
    from safetensors.torch import load, save

    from rpeg.runtime.actors import state_file as SF
    from rpeg.runtime.step.staleness import Sample

    data = SF.dumps({"buffer": [Sample(3, 1, "x")]})
    meta = SF.header_metadata(data)
    tree = meta[SF._TREE].replace("rpeg.runtime.step.staleness:", "rpeg.runtime.actors.staleness:")
    assert "rpeg.runtime.actors.staleness:Sample" in tree
    old = save(load(bytes(data)), metadata={**meta, SF._TREE: tree})
    assert SF.loads(old) == {"buffer": [Sample(3, 1, "x")]}
    bad = tree.replace("rpeg.runtime.actors.staleness:", "rpeg.runtime.actors.nothing:")
    with pytest.raises(SF.StateFileError, match="unknown class"):
        SF.loads(save(load(bytes(data)), metadata={**meta, SF._TREE: bad}))
