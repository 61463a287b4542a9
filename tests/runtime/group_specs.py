"""Compiled specs for tests that start ranks by hand (no compiler): a GroupSpec of a layout
and the UnitCall of a list of stage kinds at the config's micro-batching."""

from __future__ import annotations

from rpeg.compile import GroupSpec, TaskSpec
from rpeg.ir import StageKind
from rpeg.runtime.actors.unit_call import UnitCall


def group_spec(name, devices, roles, trainable, **layout) -> GroupSpec:
    tp = layout.pop("tp", 1)
    return GroupSpec(
        name=name,
        devices=tuple(devices),
        world_size=len(devices),
        roles=tuple(roles),
        trainable=tuple(trainable),
        units=(),
        dp=layout.pop("dp", len(devices) // tp),
        tp=tp,
        **layout,
    )


def unit_call(config, kinds, prompts=None) -> UnitCall:
    """The unit of ``kinds`` (one group, phase by its first kind) as the compiler would
    give it the config's micro-batch size and token budget."""
    kinds = tuple(StageKind(k) for k in kinds)
    w = config.workload
    unit = TaskSpec(
        name="+".join(kinds),
        stages=tuple(str(k) for k in kinds),
        kinds=kinds,
        group="g",
        phase="rollout" if kinds[0] == StageKind.generate else "train",
        micro_batch_size=w.micro_batch_size,
        fused=len(kinds) > 1,
        max_tokens_per_micro_batch=w.max_tokens_per_micro_batch,
    )
    return UnitCall(unit, prompts)
