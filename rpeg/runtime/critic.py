"""A separate critic for the recipes with one (PPO): a trunk started from a causal LM, a
value head and its optimizer; a Dask actor wraps it like a policy role (rpeg.runtime.roles)."""

from __future__ import annotations

import time

import torch

from rpeg.config import AlgorithmConfig, OptimConfig, WorkloadConfig
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.micro_batches import MicroBatching, micro_batches
from rpeg.runtime.model_io import CriticModel
from rpeg.runtime.packing import pack_micro_batch, packed_forward
from rpeg.runtime.parallel import LOCAL, RankReduce
from rpeg.runtime.precision import compute, loss_scaler_for
from rpeg.runtime.recipes import critic_value_loss
from rpeg.runtime.role_state import load_role_state, module_device, role_configs, role_state
from rpeg.runtime.updates import adamw, minibatch_updates, on_device


class CriticWorker:
    """A separate critic (trunk + value head, started from a causal LM) and its optimizer."""

    def __init__(
        self,
        lm,
        *,
        algorithm: AlgorithmConfig | None = None,
        optim: OptimConfig | None = None,
        workload: WorkloadConfig | None = None,
        seed: int = 0,
        reduce: RankReduce = LOCAL,
        compute_dtype: torch.dtype = torch.float32,
    ):
        self.algorithm, self.optim_cfg, self.workload = role_configs(algorithm, optim, workload)
        # what cuts its passes into micro-batches: the compiled unit it runs (set by the
        # stage loop, rpeg.runtime.micro_batches.unit_micro_batches), else its workload's
        self.micro_batching: MicroBatching = self.workload
        self.reduce = reduce
        self.compute_dtype = compute_dtype  # as PolicyWorker's
        self.loss_scaler = loss_scaler_for(compute_dtype)
        self.module = CriticModel(lm)
        self.optimizer = adamw(
            self.module.parameters(),
            lr=self.optim_cfg.critic_lr,
            weight_decay=self.optim_cfg.weight_decay,
        )
        self.generator = torch.Generator().manual_seed(seed + 1)
        self.shards = None
        self.module.eval()

    @property
    def device(self) -> torch.device:
        return module_device(self.module)

    def apply_layout(
        self, layout, mesh, reduce: RankReduce, *, source=None, device: torch.device | None = None
    ) -> None:
        """Shard the critic like :meth:`PolicyWorker.apply_layout` (trunk blocks over tp,
        FSDP2 over dp with the value head as its own unit); rebuilds the optimizer. With a
        ``source`` (built on the meta device) the trunk is filled from the LM's weights under
        the LM's trunk prefix and the value head initialised, on ``device``."""
        from rpeg.runtime.sharding import shard_roles

        self.shards = shard_roles(
            self.module, self.module.trunk, layout, mesh, heads=[self.module.value_head]
        )
        if source is not None:
            from rpeg.runtime.materialize import init_head, materialize, prefixed

            if device is None:
                raise ValueError("apply_layout: a source needs the device to build on")
            prefix = self.module.trunk_prefix + "."
            materialize(self.module.trunk, device, prefixed(source.fetch, prefix), "critic")
            self.module.value_head.to_empty(device=device)
            init_head(self.module.value_head)
        self.reduce = reduce
        self.optimizer = adamw(
            self.module.parameters(),
            lr=self.optim_cfg.critic_lr,
            weight_decay=self.optim_cfg.weight_decay,
        )

    def _values(self, mb: RolloutBatch) -> torch.Tensor:
        """Values ``[b,R]`` of a micro-batch (its rows end to end without padding in a
        packed unit, rpeg.runtime.packing; 0 off the response there)."""
        r = mb.response_ids.shape[1]
        dev = self.device
        if not self.micro_batching.seq_packing:
            ids, mask, pos = mb.input_ids.to(dev), mb.attention_mask.to(dev), mb.position_ids
            with compute(dev.type, self.compute_dtype):
                return self.module(ids, mask, pos.to(dev), keep_last=r + 1).values[:, :-1]
        pk = pack_micro_batch(mb, dev)
        with compute(dev.type, self.compute_dtype), packed_forward(self.module, pk) as fkw:
            v = self.module(pk.input_ids, None, pk.position_ids, keep_last=pk.keep, **fkw).values
        return pk.unpack(v[:, :-1])

    @torch.no_grad()
    def compute_values(self, batch: RolloutBatch) -> torch.Tensor:
        """Values ``[B,R]``: ``V_t`` is the value of the state before response token ``t``."""
        self.module.eval()
        out = torch.zeros(tuple(batch.response_ids.shape), dtype=torch.float32)
        for ix, mb, real in micro_batches(batch, self):
            v = self._values(mb)
            if real:
                out[ix, : v.shape[1]] = v.float().cpu() * mb.response_mask
        return out

    def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        """Minibatched clipped value-loss updates toward ``batch.returns``."""
        if batch.returns is None or batch.values is None:
            raise ValueError(
                "critic train_step needs values and returns (run the advantage stage first)"
            )
        a = self.algorithm
        t0 = time.perf_counter()

        dev = self.device

        def micro_loss(micro: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
            micro = on_device(micro, dev)
            vl, m = critic_value_loss(a, self._values(micro), micro, micro.response_mask)
            m["value_loss"] = float(vl.detach())
            return vl, m

        out = minibatch_updates(self, batch, micro_loss, grad_norm_key="critic_grad_norm")
        out["critic_train_s"] = time.perf_counter() - t0
        return out

    def state_dict(self, weights: bool = True) -> dict:
        out: dict = {"generator": self.generator.get_state()}
        if weights:
            out["module"], out["optimizer"] = role_state(self.module, self.optimizer, self.shards)
        return out

    def load_state_dict(self, state: dict) -> None:
        if "module" in state:
            load_role_state(self.module, self.optimizer, state, self.shards)
        self.generator.set_state(state["generator"])
