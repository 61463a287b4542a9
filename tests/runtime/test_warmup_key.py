"""The supervised warm-up cache of a model folder is keyed by its files, not only its path:
another model written at the same path is warmed up afresh (it reused the old warm-up)."""

from __future__ import annotations

import os


def test_a_model_rewritten_at_the_same_path_changes_the_key(tmp_path):
    from rpeg.runtime.model_io import create_tiny
    from rpeg.runtime.role_builder import folder_fingerprint

    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    m, tok = create_tiny(seed=0, **shape)
    m.save_pretrained(tmp_path, safe_serialization=True)
    tok.save_pretrained(tmp_path)
    first = folder_fingerprint(str(tmp_path))
    assert {name for name, _, _ in first} == {"config.json", "model.safetensors"}
    assert folder_fingerprint(str(tmp_path)) == first  # unchanged files: the same key
    other, _ = create_tiny(seed=1, **shape)
    other.save_pretrained(tmp_path, safe_serialization=True)
    st = os.stat(tmp_path / "model.safetensors")  # same size: only the time tells them apart
    os.utime(tmp_path / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert folder_fingerprint(str(tmp_path)) != first
    assert folder_fingerprint(str(tmp_path / "missing")) == []
