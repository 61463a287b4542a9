"""No code from a model folder is ever run (issue 28: a config with an unknown model_type and
an ``auto_map`` made transformers ask "Do you wish to run the custom code? [y/N]"; answering
y ran the file). Every load passes ``trust_remote_code=False``: the question is never asked
and the answer on stdin is never read."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _hostile_folder(tmp_path):
    marker = tmp_path / "ran"
    folder = tmp_path / "model"
    folder.mkdir()
    code = f"open({str(marker)!r}, 'w').write('ran')\nfrom transformers import PretrainedConfig\n"
    code += "class EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n"
    (folder / "evil.py").write_text(code)
    cfg = {
        "model_type": "evil",
        "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoTokenizer": ["evil.EvilConfig", None]},
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": cfg["auto_map"]["AutoTokenizer"]})
    )
    return folder, marker


@pytest.mark.parametrize("fn", ["load_model", "load_tokenizer"])
def test_a_model_folder_with_custom_code_is_refused_without_running_it(tmp_path, fn):
    folder, marker = _hostile_folder(tmp_path)
    code = f"from rpeg.runtime.model_io import {fn}\n{fn}({str(folder)!r})\n"
    got = subprocess.run(
        [sys.executable, "-c", code], input="y\ny\n", capture_output=True, text=True, timeout=120
    )
    assert got.returncode != 0  # refused ...
    assert not marker.exists()  # ... and its code never ran, though stdin said yes
