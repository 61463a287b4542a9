"""The plan as RPEG's runtime runs it, before the performance model prices it: what the
compiler resolves at compile time (rpeg.compile.layouts) resolved here the same way, so the
model prices the sharding and the decoding the ranks run. Pure."""

from __future__ import annotations

from typing import Any

from rpeg.perf import eager_cpu
from rpeg.perf.units import FWD_KINDS, GEN_KIND, TRAIN_KINDS
from rpeg.plan.schema import Plan, UnitPlan, trains_fsdp
from rpeg.specs import ClusterSpec


def torch_engine(u: UnitPlan, cuda: bool) -> bool:
    """Whether a generate unit decodes with RPEG's torch engine, as the compiler resolves
    it: ``engine: torch``, or ``auto`` off CUDA devices (CPU workers)."""
    return u.engine == "torch" or (u.engine == "auto" and not cuda)


def plan_as_run(plan: Plan, cluster: ClusterSpec, units: Any) -> Plan:
    """``plan`` with ``engine: auto`` resolved as the compiler resolves it, so the model
    prices the sharding the ranks run: a training unit's by
    :func:`rpeg.plan.schema.trains_fsdp` (FSDP on CUDA devices at dp > 1 without pp);
    then a forward unit (log-probs, values) on the same devices as an FSDP training unit
    runs in that group's FSDP layout (the compiler's group is a device set, and every role
    of an FSDP group is sharded: rpeg.runtime.sharding); a torch-engine generate unit on an
    ep training unit's devices at its tp decodes at that ep. Other units as given."""
    cuda = not eager_cpu.is_cpu(cluster.gpu)
    kinds = {uname: {k for _, k, _ in members} for uname, members in units}
    changed: dict[str, UnitPlan] = {}
    fsdp_devices: set[tuple[int, ...]] = set()
    for uname, ks in kinds.items():
        u = plan.units.get(uname)
        if u is None or not ks & set(TRAIN_KINDS):
            continue
        dp = u.num_devices // (u.tp * u.pp * u.cp)
        if trains_fsdp(u.engine, cuda=cuda, dp=dp, pp=u.pp, cp=u.cp):
            fsdp_devices.add(tuple(u.devices))
            if u.engine == "auto":
                changed[uname] = u.model_copy(update={"engine": "fsdp"})
    for uname, ks in kinds.items():
        u = plan.units.get(uname)
        if u is None or u.engine != "auto" or not ks & set(FWD_KINDS) or ks & set(TRAIN_KINDS):
            continue
        if tuple(u.devices) in fsdp_devices:
            changed[uname] = u.model_copy(update={"engine": "fsdp"})
    # a torch-engine generate unit at the training unit's tp on its devices decodes on the
    # training weights, experts split at the group's ep (the compiler notes it:
    # rpeg.compile.layouts._ep_layout); vLLM holds its own whole copy
    train_ep = {
        (tuple(u.devices), u.tp): u.ep
        for n, ks in kinds.items()
        if (u := plan.units.get(n)) is not None and ks & set(TRAIN_KINDS) and u.ep > 1
    }
    for uname, ks in kinds.items():
        u = plan.units.get(uname)
        if u is None or GEN_KIND not in ks or ks & set(TRAIN_KINDS):
            continue
        ep = train_ep.get((tuple(u.devices), u.tp), u.ep)
        if torch_engine(u, cuda) and ep != u.ep:
            changed[uname] = u.model_copy(update={"ep": ep})
    if not changed:
        return plan
    return plan.model_copy(update={"units": {**plan.units, **changed}})
