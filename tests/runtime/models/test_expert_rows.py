"""A rank at ep > 1 reads only its experts' rows from a model folder (rpeg.runtime.materialize
``fetch_rows``): from a folder storing each expert apart (transformers' checkpoint layout,
stacked by the conversion mapping) only those experts' entries; a stored tensor by
``get_slice``. The rows equal the full tensor's."""

from __future__ import annotations

import torch

from tests.runtime.models.tiny_folders import write_tiny_folder


def test_fetch_rows_equals_the_full_tensors_rows(tmp_path):
    from rpeg.runtime.materialize import SafetensorsSource

    src = SafetensorsSource(write_tiny_folder("qwen3_moe", tmp_path / "moe"))
    name = "model.layers.1.mlp.experts.gate_up_proj"  # stacked from 4 experts' gate and up
    full = src.fetch(name)
    assert full is not None and full.shape[0] == 4
    reads: list[str] = []
    raw = src._raw
    src._convert = None  # looked up again, counting the folder's tensors read

    def counted(n):
        reads.append(n)
        return raw(n)

    src._raw = counted
    part = src.fetch_rows(name, 2, 4)
    assert torch.equal(part, full[2:4])
    experts = {r.split(".")[5] for r in reads if ".experts." in r and r != name}
    assert experts == {"2", "3"}, reads  # experts 2 and 3 only
    emb = "model.embed_tokens.weight"  # stored as the model names it: a slice of the file
    assert torch.equal(src.fetch_rows(emb, 10, 20), src.fetch(emb)[10:20])
