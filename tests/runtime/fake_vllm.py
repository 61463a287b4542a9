"""A stand-in for ``vllm.LLM`` with ``tp`` tensor-parallel workers, for unit tests of the vLLM
engine without vLLM (tests/vllm/ runs the real one).

What it shares with the real V1 engine, and is tested for here:
- ``collective_rpc`` calls a worker method by name on every worker at once (each its own
  thread here; its own process in vLLM), and its arguments must survive V1's msgpack: plain
  strings, bytes (a CUDA IPC handle), numbers, lists and dicts. A tensor (or anything else:
  a torch dtype or class, as ``reduce_tensor``'s raw arguments hold) is refused with TypeError --
  the real engine core would decode a tensor untyped (``['float32', [512, 1024], 1]``) or fail
  with ``cannot pickle memoryview``;
- the workers are the real :class:`~rpeg.runtime.engines.vllm_worker.WeightTransferExtension`
  on a model that loads full Hugging Face tensors and keeps its tensor-parallel slice, as
  vLLM's loaders do; the tensors reach them through a real gloo update group;
- sleep mode: ``enable_sleep_mode=True`` on a platform without it (``platform_sleep=False``,
  vLLM's CPU build) is refused at construction with vLLM's message, and ``sleep`` / ``wake_up``
  on an engine built without it are refused (the engine must never call them there);
  every sleep/wake call is recorded in ``calls``.

:func:`fake_vllm_module` is a stand-in ``vllm`` package (``LLM``, ``SamplingParams``,
``EngineArgs``, ``platforms.current_platform``) whose ``LLM`` is a :class:`FakeLLM` over the
checkpoint folder it is given, so ``VLLMEngine.build`` and the runtimes run against it.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import threading
import types
from pathlib import Path
from types import SimpleNamespace

import torch

from rpeg.runtime.engines.vllm_worker import WeightTransferExtension

_COL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens")  # split rows
_ROW = ("o_proj", "down_proj")  # split columns
_WIRE_SCALARS = (str, bytes, int, float, bool, type(None))  # msgpack str / bin / ...


def shard(name: str, full: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    if any(k in name for k in _COL):
        return full.chunk(tp, dim=0)[rank]
    if any(k in name for k in _ROW):
        return full.chunk(tp, dim=1)[rank]
    return full


def check_wire(value, where: str = "args") -> None:
    """TypeError unless ``value`` is made of what V1's msgpack carries as itself."""
    if isinstance(value, _WIRE_SCALARS):
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_wire(v, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            check_wire(k, f"{where} key")
            check_wire(v, f"{where}[{k!r}]")
        return
    raise TypeError(
        f"collective_rpc {where}: {type(value).__name__} cannot cross vLLM V1's engine-core "
        "boundary (tensors arrive untyped; send them through a process group)"
    )


class FakeShardModel(torch.nn.Module):
    """One tensor-parallel rank's model: keeps its slice of each full HF tensor it loads."""

    def __init__(self, rank: int, tp: int, names: list[str], fail_on: str | None = None):
        super().__init__()
        self.rank, self.tp = rank, tp
        self.loaded: dict[str, torch.Tensor] = {}
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.names = set(names)
        self.fail_on = fail_on

    def load_weights(self, weights):
        for name, full in weights:
            if name == self.fail_on or name not in self.names:
                raise KeyError(f"rank {self.rank}: cannot load weight {name}")
            self.loaded[name] = shard(name, full, self.rank, self.tp).clone()
        return set(self.loaded)


class FakeWorker(WeightTransferExtension):
    def __init__(self, rank: int, model: FakeShardModel):
        self.rank = rank
        self.model_runner = SimpleNamespace(model=model)


class FakeLLM:
    """The methods of ``vllm.LLM`` the engine calls, over ``tp`` fake workers.
    ``drop_rank``: that worker's answers to ``rpeg_receive_weights`` are lost."""

    def __init__(
        self,
        tp: int,
        names: list[str],
        *,
        drop_rank: int | None = None,
        fail_on: str | None = None,
        enable_sleep_mode: bool = False,
        platform_sleep: bool = True,
    ):
        if enable_sleep_mode and not platform_sleep:  # vllm/config/model.py
            raise ValueError("Sleep mode is not supported on current platform.")
        self.enable_sleep_mode = enable_sleep_mode
        self.workers = [FakeWorker(r, FakeShardModel(r, tp, names, fail_on)) for r in range(tp)]
        self.drop_rank = drop_rank
        self.calls: list[tuple] = []
        self.shut_down = False

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        assert isinstance(method, str)  # by name: no pickled callables
        check_wire(list(args))
        check_wire(dict(kwargs or {}), "kwargs")
        self.calls.append(("rpc", method, args))
        results: list = [None] * len(self.workers)
        errors: list[BaseException] = []

        def run(r, w):
            try:
                results[r] = getattr(w, method)(*args, **(kwargs or {}))
            except BaseException as e:  # noqa: BLE001 -- re-raised below, as vLLM does
                errors.append(e)

        threads = [threading.Thread(target=run, args=(r, w)) for r, w in enumerate(self.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        if errors:
            raise RuntimeError(f"worker failed: {errors[0]!r}")
        if method in ("rpeg_receive_weights", "rpeg_receive_ipc") and self.drop_rank is not None:
            return [x for r, x in enumerate(results) if r != self.drop_rank]
        return results

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def _sleep_mode(self, what):
        if not self.enable_sleep_mode:
            raise RuntimeError(f"{what}: this LLM was built without enable_sleep_mode")

    def sleep(self, level=1):
        self._sleep_mode("sleep")
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self._sleep_mode("wake_up")
        self.calls.append(("wake_up", tuple(tags) if tags else None))

    def shutdown(self):
        self.shut_down = True

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append(("generate", prompts, params))
        outs = []
        for p, sp in zip(prompts, params, strict=True):
            n = min(sp["max_tokens"], 3)
            toks = [p["prompt_token_ids"][-1] + 1 + j for j in range(n)]
            lps = [{t: SimpleNamespace(logprob=-0.5 * (j + 1))} for j, t in enumerate(toks)]
            c = SimpleNamespace(token_ids=toks, logprobs=lps, finish_reason="length")
            outs.append(SimpleNamespace(outputs=[c]))
        return outs


def _config_names(folder: Path) -> list[str]:
    """The checkpoint names a model of ``folder``'s ``config.json`` loads (what vLLM's model
    built with ``load_format="dummy"`` expects): its parameters, built on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rpeg.runtime.engines.vllm_requests import hf_names

    cfg = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    return [n for n, _ in hf_names(m.state_dict(), tie_word_embeddings=tied)]


def fake_vllm_module(*, platform_sleep: bool, tp: int = 1) -> types.ModuleType:
    """A ``vllm`` package whose ``LLM(model=folder, ...)`` is a :class:`FakeLLM` with ``tp``
    workers over the weight names of ``folder``'s safetensors checkpoint. ``platform_sleep``:
    whether ``current_platform`` has sleep mode (False: vLLM's CPU build). ``built`` lists
    every LLM made."""
    from safetensors import safe_open

    mod = types.ModuleType("vllm")
    mod.__spec__ = importlib.machinery.ModuleSpec("vllm", None, origin="fake_vllm")
    mod.built = []

    def llm(model, enable_sleep_mode=False, tensor_parallel_size=tp, **kwargs):
        if kwargs.get("load_format") == "dummy":  # placeholder weights: the config's names
            names = _config_names(Path(model))
        else:
            with safe_open(str(Path(model) / "model.safetensors"), "pt") as fh:
                names = list(fh.keys())
        out = FakeLLM(
            tensor_parallel_size,
            names,
            enable_sleep_mode=enable_sleep_mode,
            platform_sleep=platform_sleep,
        )
        mod.built.append(out)
        return out

    @dataclasses.dataclass
    class EngineArgs:
        logprobs_mode: str = "raw_logprobs"

    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = SimpleNamespace(is_sleep_mode_available=lambda: platform_sleep)
    mod.LLM, mod.SamplingParams, mod.EngineArgs, mod.platforms = llm, dict, EngineArgs, platforms
    mod.__version__ = "0.32.0"
    return mod
