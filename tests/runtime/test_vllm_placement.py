"""A rank's vLLM engine lands on the rank's GPU, not GPU 0 (rpeg.runtime.engines.vllm_placement):
the child processes vLLM starts take the first GPUs they see, so the engine is built with
``CUDA_VISIBLE_DEVICES`` rotated to start at the rank's GPU (dask-cuda's convention), and the
variable is put back afterwards. Runs on CPU: the CUDA calls are replaced by recorders."""

from __future__ import annotations

import contextlib
import os
import shutil
from types import SimpleNamespace

import pytest
import torch

from rpeg.errors import RpegError
from rpeg.runtime.engines import vllm_placement
from rpeg.runtime.engines.vllm import VLLMEngine
from rpeg.runtime.engines.vllm_placement import engine_gpu, visible_first


@pytest.mark.parametrize(
    ("index", "visible", "count", "want"),
    [
        (2, None, 4, "2,3,0,1"),  # every GPU of the host visible: rotate 0..3
        (1, "4,5,6,7", 8, "5,6,7,4"),  # a restricted list: rotate the list, not 0..n
        (0, "3,1", 2, "3,1"),
        (1, "GPU-aaa, GPU-bbb", 2, "GPU-bbb,GPU-aaa"),  # UUIDs and spaces
        (3, "", 4, "3,0,1,2"),  # an empty variable reads as unset
    ],
)
def test_visible_first_rotates_the_list_to_the_ranks_gpu(index, visible, count, want):
    assert visible_first(index, visible, count) == want


def test_a_gpu_the_process_does_not_see_is_refused_by_name():
    with pytest.raises(RpegError, match=r"cuda:2 is not one of this process's 2 visible"):
        visible_first(2, "0,1", 8)


@pytest.fixture
def no_cuda_switch(monkeypatch):
    entered: list[int] = []

    @contextlib.contextmanager
    def device(i):
        entered.append(i)
        yield

    monkeypatch.setattr(vllm_placement.torch.cuda, "device", device)
    return entered


@pytest.mark.parametrize("before", [None, "4,5,6,7"])
def test_engine_gpu_sets_the_variable_inside_and_restores_it(monkeypatch, no_cuda_switch, before):
    if before is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", before)
    with engine_gpu(torch.device("cuda", 2), count=4):
        inside = os.environ.get("CUDA_VISIBLE_DEVICES")
    assert inside == ("2,3,0,1" if before is None else "6,7,4,5")
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == before
    assert no_cuda_switch == [2]


def test_engine_gpu_restores_the_variable_when_the_build_fails(monkeypatch, no_cuda_switch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with (
        pytest.raises(RuntimeError, match="engine failed"),
        engine_gpu(torch.device("cuda", 1), count=2),
    ):
        raise RuntimeError("engine failed")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"


@pytest.mark.parametrize("device", [None, torch.device("cpu"), torch.device("cuda", 0)])
def test_cpu_and_the_first_gpu_change_nothing(monkeypatch, no_cuda_switch, device):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    with engine_gpu(device, count=2):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "5,6"
    assert no_cuda_switch == []


def test_from_source_builds_the_engine_on_the_models_gpu(monkeypatch, no_cuda_switch, tmp_path):
    """A model on cuda:3 of a 4-GPU worker (plain Dask: every GPU visible): the LLM is built
    while CUDA_VISIBLE_DEVICES starts at 3, and the variable is unset again afterwards; only
    the config is written, vLLM loads placeholder weights and the real ones follow as one
    update from the source, on the model's device."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(vllm_placement.torch.cuda, "device_count", lambda: 4)
    seen = {}

    def build(cls, folder, **kw):
        seen["visible"] = os.environ.get("CUDA_VISIBLE_DEVICES")
        seen["load_format"] = kw.get("load_format")
        seen["files"] = sorted(os.listdir(folder))

        def update_from(source, version, device):
            seen["update"] = (sorted(source[0]), version, device)

        return SimpleNamespace(
            folder=None, param_bytes=0, policy_version=0, update_from=update_from
        )

    monkeypatch.setattr(VLLMEngine, "build", classmethod(build))

    def save_pretrained(folder):
        with open(os.path.join(folder, "config.json"), "w") as fh:
            fh.write("{}")

    config = SimpleNamespace(tie_word_embeddings=False, save_pretrained=save_pretrained)
    meta = {"w": ((2, 5), torch.float32)}
    cuda3 = torch.device("cuda", 3)
    eng = VLLMEngine.from_source(
        config, (meta, lambda n: None), cuda3, pad_id=0, eos_id=1, dtype="float32"
    )
    shutil.rmtree(eng.folder, ignore_errors=True)
    assert seen["visible"] == "3,0,1,2"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert seen["load_format"] == "dummy" and seen["files"] == ["config.json"]
    assert seen["update"] == (["w"], 0, cuda3)
    assert eng.param_bytes == 40  # 10 fp32 parameters
