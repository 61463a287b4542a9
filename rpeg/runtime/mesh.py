"""How the ranks of an actor group lay out a model role (:class:`Layout`, from the compiled
:class:`rpeg.compile.GroupSpec`), whether a model splits at a tp (:func:`layout_problems`),
the process-group backend of a device type and the ``("dp", "tp")`` device mesh of a layout
(:func:`build_mesh`). Used by rpeg.runtime.sharding."""

from __future__ import annotations

from dataclasses import dataclass

from rpeg.compile.step import DEFAULT_DEVICE_TYPE, DEFAULT_DTYPE, GroupSpec
from rpeg.errors import ConfigError, Problem
from rpeg.plan.schema import DEFAULT_PP_SCHEDULE


@dataclass(frozen=True)
class Layout:
    """How ``dp * pp * cp * tp`` ranks lay out one role (rank order: tp innermost, then cp,
    then pp, dp outermost: :class:`rpeg.compile.GroupSpec`). ``fsdp``: shard parameters, gradients and
    optimizer state over ``dp`` (FSDP2); otherwise ``dp`` holds replicas.
    ``reshard_after_forward`` (FSDP training passes): free each block's gathered parameters
    after its forward; False keeps them gathered until backward (:meth:`Shards.training_pass`)."""

    dp: int = 1
    tp: int = 1
    fsdp: bool = False
    device_type: str = DEFAULT_DEVICE_TYPE
    dtype: str = DEFAULT_DTYPE
    reshard_after_forward: bool = True
    recompute: bool = False  # training checkpoints every decoder layer (rpeg.runtime.unit_memory)
    pp: int = 1
    cp: int = 1
    ep: int = 1
    pp_schedule: str = DEFAULT_PP_SCHEDULE

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    @property
    def replica_ranks(self) -> int:
        """Ranks of one data-parallel index (they hold the same rows): ``tp * cp * pp``."""
        return self.tp * self.cp * self.pp

    @property
    def sharded(self) -> bool:
        """True when the role needs DTensor/FSDP (not plain replicas): tp, FSDP over dp (over
        dp x cp at context parallelism: rpeg.runtime.context_parallel.context_fsdp), experts
        split over ep (rpeg.runtime.expert_parallel)."""
        fsdp_ranks = self.dp * (self.cp if self.pp == 1 else 1)
        return self.tp > 1 or (self.fsdp and fsdp_ranks > 1) or self.ep > 1

    def dp_index(self, rank: int) -> int:
        return rank // self.replica_ranks

    def tp_index(self, rank: int) -> int:
        return rank % self.tp

    def cp_index(self, rank: int) -> int:
        return (rank // self.tp) % self.cp

    def pp_index(self, rank: int) -> int:
        return (rank // (self.tp * self.cp)) % self.pp

    @classmethod
    def from_group(cls, group: GroupSpec) -> Layout:
        """The training layout of a compiled :class:`GroupSpec`."""
        ws, dp, tp = group.world_size, group.dp, group.tp
        lay = cls(
            dp=dp,
            tp=tp,
            pp=group.pp,
            cp=group.cp,
            ep=group.ep,
            pp_schedule=group.pp_schedule,
            fsdp=group.fsdp,
            device_type=group.device_type,
            dtype=group.dtype,
            reshard_after_forward=group.reshard_after_forward,
            recompute=group.recompute,
        )
        if lay.world_size != ws:
            raise ConfigError(
                [
                    Problem(
                        f"group {group.name}",
                        f"dp={dp} x pp={lay.pp} x cp={lay.cp} x tp={tp} = {lay.world_size} "
                        f"ranks but world_size={ws}",
                    )
                ]
            )
        return lay


def layout_problems(model_config, tp: int, where: str = "plan.layout.tp") -> list[Problem]:
    """Why ``tp`` cannot split this model (heads, kv heads, MLP width), as problems."""
    if tp <= 1:
        return []
    out = []
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        n = getattr(model_config, name, None)
        if n is not None and n % tp:
            out.append(Problem(where, f"tp={tp} does not divide the model's {name}={n}"))
    return out


def process_group_backend(device_type: str) -> str:
    """NCCL for CUDA ranks, gloo otherwise (NCCL refuses CPU tensors)."""
    return "nccl" if device_type == "cuda" else "gloo"


def build_mesh(layout: Layout):
    """The ``("dp", "tp")`` DeviceMesh of ``layout`` over the initialized default process
    group (its world size must be ``dp * tp``)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        raise RuntimeError("build_mesh needs an initialized torch.distributed process group")
    if dist.get_world_size() != layout.world_size:
        raise RuntimeError(
            f"process group has {dist.get_world_size()} ranks, layout needs {layout.world_size}"
        )
    return init_device_mesh(layout.device_type, (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))
