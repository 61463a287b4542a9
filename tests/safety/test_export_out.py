"""Issue 44, item 2: ``rpeg export`` never deletes or replaces what it did not write. A
non-empty ``--out`` is refused before the checkpoint is read (exit 2) unless ``--force``, and
``--force`` replaces only the files a previous export listed in its manifest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from rpeg.errors import ConfigError
from rpeg.runtime.actors.checkpoint import COMMIT, dumps
from rpeg.runtime.export import export_checkpoint
from rpeg.runtime.export_out import MANIFEST

SHAPE = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1}


def _checkpoint(tmp_path: Path) -> str:
    """A step folder holding a tiny policy's ``trainer.pt`` and a matching commit marker."""
    from rpeg.runtime.model_io import create_tiny

    model, _ = create_tiny(seed=1, **SHAPE)
    data = dumps({"trainer": {"actor": {"module": model.state_dict()}}})
    step = tmp_path / "ck" / "run-x" / "step-00000001"
    step.mkdir(parents=True)
    (step / "trainer.pt").write_bytes(data)
    files = {"trainer.pt": {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}}
    meta = {"format": 2, "step": 1, "run_id": "run-x", "files": files}
    meta["model"] = {"policy": {"tiny_shape": SHAPE}}
    (step / COMMIT).write_text(json.dumps(meta))
    return str(step)


def _users_model(folder: Path) -> dict[str, bytes]:
    """A model folder as the issue found it: config, two shards, their index."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "config.json": b'{"model_type": "mine"}',
        "model-00001-of-00002.safetensors": b"shard one",
        "model-00002-of-00002.safetensors": b"shard two",
        "model.safetensors.index.json": b'{"weight_map": {}}',
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_a_folder_holding_a_model_is_refused_and_left_as_it_was(tmp_path):
    ck = _checkpoint(tmp_path)
    out = tmp_path / "mymodel"
    before = _users_model(out)
    with pytest.raises(ConfigError, match="is not empty") as got:
        export_checkpoint(ck, str(out))
    assert "--out" in str(got.value) and "config.json" in str(got.value)
    assert _contents(out) == before


def test_force_without_a_previous_export_is_refused_too(tmp_path):
    ck = _checkpoint(tmp_path)
    out = tmp_path / "mymodel"
    before = _users_model(out)
    with pytest.raises(ConfigError, match=f"no rpeg export wrote.*no {MANIFEST}"):
        export_checkpoint(ck, str(out), force=True)
    assert _contents(out) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".rpeg-export")] == []


def test_force_replaces_only_a_previous_exports_files(tmp_path):
    from transformers import AutoModelForCausalLM

    ck = _checkpoint(tmp_path)
    out = tmp_path / "hf"
    export_checkpoint(ck, str(out))  # a new folder: written with its manifest
    listed = json.loads((out / MANIFEST).read_text())["files"]
    assert "config.json" in listed and "model.safetensors" in listed
    (out / "NOTES.md").write_text("mine")  # the user's own file beside the export
    (out / "model.safetensors.old").write_bytes(b"mine too")
    listed["stale-from-before.bin"] = 5  # a file the previous export wrote, now gone
    (out / "stale-from-before.bin").write_bytes(b"12345")
    (out / MANIFEST).write_text(json.dumps({"files": listed}))
    export_checkpoint(ck, str(out), force=True)
    assert (out / "NOTES.md").read_text() == "mine"
    assert (out / "model.safetensors.old").read_bytes() == b"mine too"
    assert not (out / "stale-from-before.bin").exists()  # listed: the export's own
    assert "stale-from-before.bin" not in json.loads((out / MANIFEST).read_text())["files"]
    AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=False)


def test_force_refuses_a_listed_file_the_user_changed(tmp_path):
    ck = _checkpoint(tmp_path)
    out = tmp_path / "hf"
    export_checkpoint(ck, str(out))
    (out / "config.json").write_text('{"edited": "by hand, a longer file than before......."}')
    with pytest.raises(ConfigError, match="config.json changed since"):
        export_checkpoint(ck, str(out), force=True)
    assert "edited" in (out / "config.json").read_text()


def test_the_cli_refuses_with_exit_2_before_reading_the_checkpoint(tmp_path, capsys):
    from rpeg.cli import main

    out = tmp_path / "mymodel"
    before = _users_model(out)
    code = main(["export", str(tmp_path / "no-such-checkpoint"), "--out", str(out)])
    assert code == 2
    assert "is not empty" in capsys.readouterr().err
    assert _contents(out) == before
