"""The Dask actor of one rank (one device): it holds the model roles of its actor group
(actor, reference, critic) built exactly like :class:`rpeg.runtime.local_trainer.LocalTrainer` does,
the optimizers of trainable roles, and a per-step store of :class:`RolloutBatch` es so that
a fused group (or colocated units) never moves data out of the process between stages.

Ranks of one group form a torch.distributed process group (gloo on CPU, NCCL on GPU); a
trainable role is wrapped in DistributedDataParallel, so gradients are averaged across ranks
before clipping and the optimizer step. Each rank trains on its shard of the step's prompts.
"""

from __future__ import annotations

import copy
import io
import os
import random
import socket
import time
from typing import Any

import torch

from rpeg.config import RunConfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def gen_seed(config: RunConfig, step: int, rank: int) -> int:
    """Generation seed of ``step`` on ``rank`` (rank 0 = the single-process trainer's)."""
    return config.runtime.seed * 100_003 + step + rank * 7_919


# Data parallelism: batch-wide statistics (advantage whitening, the loss normalizer of a
# mini-batch) span every rank's shard. After joining the process group, the trainable workers
# get a ``rpeg.runtime.parallel.RankReduce`` that all-reduces over the group, and the advantage
# stage is given the same; GRPO/RLOO groups are never split (driver.shard_groups).


def process_group_backend(device: torch.device) -> str:
    """NCCL for models that live on a CUDA device, gloo otherwise: the collectives run on the
    tensors' device, and NCCL refuses CPU tensors. The runtime keeps its roles on the CPU
    today (no per-rank GPU placement yet, docs/runtime.md), so a GPU machine runs gloo."""
    return "nccl" if device.type == "cuda" else "gloo"


class RankActor:
    """One rank of an actor group. Methods are the stage kinds; called through Dask."""

    def __init__(
        self, config_yaml: str, group: dict[str, Any], rank: int, async_rollout: bool = False
    ):
        self.config = c = RunConfig.from_yaml(config_yaml)
        torch.set_num_threads(c.runtime.torch_threads)
        from rpeg.runtime.actors import serializers

        serializers.register()
        self.group = group
        self.rank = rank
        self.world_size = int(group["world_size"])
        self.roles = list(group["roles"])
        self.trainable = list(group["trainable"])
        self.store: dict[int, Any] = {}
        self.pg_ready = False
        from rpeg.runtime.parallel import LOCAL

        self.reduce = LOCAL  # replaced by a process-group reduce when the group has > 1 rank
        self._build(async_rollout)

    # ---------------------------------------------------------------- construction
    def _build(self, async_rollout: bool) -> None:
        from rpeg.runtime.data import build_task_data
        from rpeg.runtime.engines.torch_engine import TorchEngine
        from rpeg.runtime.local_trainer import build_policy
        from rpeg.runtime.rewards import RewardSet
        from rpeg.runtime.roles import CriticWorker, PolicyWorker

        c = self.config
        a = c.algorithm
        random.seed(c.runtime.seed)
        self.rewards = RewardSet(c.task.rewards)
        _, self.heldout = build_task_data(c.task)
        model, tok, self.warmup_info = build_policy(c)
        self.tokenizer = tok
        ppo = a.name == "ppo"
        self.reference = None
        if "reference" in self.roles:
            self.reference = PolicyWorker(
                copy.deepcopy(model), tok, workload=c.workload, trainable=False
            )
        self.actor = None
        self.critic = None
        if "actor" in self.roles:
            trainable = "actor" in self.trainable
            engine = None
            if trainable and c.runtime.max_staleness > 0 and not async_rollout:
                # colocated generation with k>0: a lagging engine copy, like the local trainer
                engine = TorchEngine(copy.deepcopy(model), tok.pad_token_id, tok.eos_token_id)
            self.actor = PolicyWorker(
                model,
                tok,
                algorithm=a,
                optim=c.optim,
                workload=c.workload,
                trainable=trainable,
                value_head=ppo and a.share_actor_critic,
                engine=engine,
                seed=c.runtime.seed,
            )
        if "critic" in self.roles:
            self.critic = CriticWorker(
                copy.deepcopy(model),
                algorithm=a,
                optim=c.optim,
                workload=c.workload,
                seed=c.runtime.seed,
            )

    def ping(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "rank": self.rank,
            "group": self.group["name"],
            "host": socket.gethostname(),
        }

    def rendezvous(self) -> str:
        """An init_method URL on this (rank 0) host."""
        host = socket.gethostbyname(socket.gethostname())
        return f"tcp://{host}:{_free_port()}"

    def init_process_group(self, init_method: str, timeout_s: float = 120.0) -> bool:
        """Join the group's process group and wrap trainable roles in DDP."""
        import datetime

        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        if self.world_size == 1:
            return True
        if dist.is_initialized():
            raise RuntimeError("this worker process already hosts a rank of another group")
        backend = process_group_backend(self._model_device())
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        from rpeg.runtime.parallel import process_group_reduce

        self.reduce = process_group_reduce()
        if self.actor is not None and self.actor.optimizer is not None:
            self.actor.module = DDP(self.actor.module, find_unused_parameters=False)
            self.actor.reduce = self.reduce
        if self.critic is not None:
            self.critic.module = DDP(self.critic.module, find_unused_parameters=False)
            self.critic.reduce = self.reduce
        self.pg_ready = True
        return True

    def _model_device(self) -> torch.device:
        for role in (self.actor, self.critic, self.reference):
            prm = next(role.module.parameters(), None) if role is not None else None
            if prm is not None:
                return prm.device
        return torch.device("cpu")

    # ---------------------------------------------------------------- data
    def put_batch(self, step: int, batch: Any) -> int:
        self.store[step] = batch
        return batch.size

    def get_batch(self, step: int, pop: bool = False) -> Any:
        return self.store.pop(step) if pop else self.store[step]

    def drop(self, step: int) -> None:
        self.store.pop(step, None)

    def policy_version(self) -> int:
        return -1 if self.actor is None else int(self.actor.policy_version)

    def engine_version(self) -> int:
        return -1 if self.actor is None else int(self.actor.engine.policy_version)

    # ---------------------------------------------------------------- stages
    def run_unit(
        self, step: int, stages: list[str], kinds: list[str], examples: Any = None
    ) -> dict[str, float]:
        """Run the stages of one execution unit back to back on this rank's batch of ``step``."""
        from rpeg.runtime import stages as S

        c = self.config
        m: dict[str, Any] = {}
        t0 = time.perf_counter()
        spans: list[tuple[str, float, float]] = []
        ctx = S.StageContext(
            c,
            actor=self.actor,
            reference=self.reference,
            critic=self.critic,
            rewards=self.rewards,
            reduce=self.reduce,
        )
        for kind in kinds:
            ts = time.time()
            batch = self.store.get(step)
            if kind == "sync_weights":
                m.update(self._sync_local())
            else:
                batch, sm = S.run_stage(
                    kind, ctx, batch, examples=examples, seed=gen_seed(c, step, self.rank)
                )
                m.update(sm)
            self.store[step] = batch
            spans.append((kind, ts, time.time()))
        m["unit_s"] = time.perf_counter() - t0
        m["_spans"] = spans
        m["_pid"] = os.getpid()
        if batch is not None:
            m["num_tokens"] = float(batch.num_tokens)
        return m

    def _sync_local(self) -> dict[str, float]:
        """Weight sync when the generator lives in this process (mirrors LocalTrainer)."""
        from rpeg.runtime.engines.torch_engine import TorchEngine

        wk = self.actor
        eng = wk.engine
        if isinstance(eng, TorchEngine) and eng.model is wk.lm:
            eng.policy_version = wk.policy_version
            return {}
        if wk.policy_version + 1 - eng.policy_version > self.config.runtime.max_staleness:
            t0 = time.perf_counter()
            eng.update_weights(wk.get_weights(), wk.policy_version)
            return {"weight_sync_s": time.perf_counter() - t0}
        return {}

    # ---------------------------------------------------------------- weight sync
    def get_weight_buckets(self, bucket_bytes: int) -> tuple[list[Any], int]:
        from rpeg.runtime.actors.weight_sync import pack

        return pack(self.actor.get_weights(), bucket_bytes), int(self.actor.policy_version)

    def load_weight_buckets(self, buckets: list[Any], version: int) -> int:
        from rpeg.runtime.actors.weight_sync import unpack

        self.actor.set_weights(unpack(buckets), policy_version=version)
        self.actor.engine.policy_version = version
        return version

    # ---------------------------------------------------------------- evaluation
    def evaluate(self) -> float:
        from rpeg.runtime import stages as S
        from rpeg.runtime.engines.torch_engine import TorchEngine

        if not self.heldout:
            return float("nan")
        w = copy.copy(self.actor)
        w.engine = TorchEngine(
            self.actor.lm, self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        )
        batch, _ = S.generate_stage(
            w,
            self.heldout,
            1,
            prompt_template=self.config.task.prompt_template,
            params=self.actor.sampling_params(greedy=True),
            seed=0,
        )
        _, rm = S.reward_stage(batch, self.rewards)
        return rm["accuracy"]

    # ---------------------------------------------------------------- checkpoints
    def _unwrapped(self, worker):
        class _Ctx:
            def __enter__(s):
                s.ddp = worker.module
                if (
                    hasattr(s.ddp, "module")
                    and s.ddp.__class__.__name__ == "DistributedDataParallel"
                ):
                    worker.module = s.ddp.module
                return worker

            def __exit__(s, *exc):
                worker.module = s.ddp

        return _Ctx()

    def state_bytes(self) -> bytes:
        """Weights, optimizers, RNG states and policy/engine versions of this rank."""
        st: dict[str, Any] = {"rank": self.rank, "group": self.group["name"]}
        for name in ("actor", "reference", "critic"):
            wk = getattr(self, name)
            if wk is None:
                continue
            with self._unwrapped(wk) as w:
                st[name] = w.state_dict()
        if self.actor is not None:
            st["engine_version"] = int(self.actor.engine.policy_version)
            if self.actor.engine.model is not self.actor.lm:
                st["engine_weights"] = {
                    k: v.clone() for k, v in self.actor.engine.model.state_dict().items()
                }
        buf = io.BytesIO()
        torch.save(st, buf)
        return buf.getvalue()

    def load_state_bytes(self, data: bytes) -> int:
        st = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
        for name in ("actor", "reference", "critic"):
            wk = getattr(self, name)
            if wk is None or name not in st:
                continue
            with self._unwrapped(wk) as w:
                w.load_state_dict(st[name])
        if self.actor is not None:
            if "engine_weights" in st and self.actor.engine.model is not self.actor.lm:
                self.actor.engine.update_weights(st["engine_weights"], st["engine_version"])
            self.actor.engine.policy_version = st.get("engine_version", self.actor.policy_version)
        return self.policy_version()

    def param_checksum(self) -> float:
        """Sum of the actor's weights (data-parallel ranks must agree)."""
        return float(sum(float(v.double().sum()) for v in self.actor.lm.state_dict().values()))

    def close(self) -> None:
        import torch.distributed as dist

        if self.pg_ready and dist.is_initialized():
            dist.destroy_process_group()
            self.pg_ready = False
