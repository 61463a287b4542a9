"""What a process's model roles hold in a checkpoint, in one format for both runtimes
(:func:`roles_state` / :func:`load_roles_state`: each present role's ``state_dict`` -- actor,
reference, critic --, the actor's engine version and a lagging engine copy's full weights),
and one rank's state file built from it (:func:`rank_state_bytes`). The single-process trainer
writes the same role state inside its own part (rpeg.runtime.local_trainer)."""

from __future__ import annotations

from typing import Any

from rpeg.runtime.actors.checkpoint.layout import CheckpointError, dumps, loads


# --------------------------------------------------------------------------- roles' state
def roles_state(roles: dict[str, Any], light: bool = False) -> dict[str, Any]:
    """Each present role's ``state_dict`` (``roles``: actor / reference / critic, None when
    absent), the actor's engine version, and a lagging engine copy's full weights. ``light``:
    no weights or optimizer state (a sharded group writes those itself:
    RankActor.save_shards), RNG states and versions only."""
    st: dict[str, Any] = {}
    for name, wk in roles.items():
        if wk is not None:
            st[name] = wk.state_dict(weights=False) if light else wk.state_dict()
    actor = roles.get("actor")
    if actor is not None and not light:
        st["engine_version"] = int(actor.engine.policy_version)
        if getattr(actor.engine, "model", actor.lm) is not actor.lm:
            from rpeg.runtime.sharding import full_state_dict

            st["engine_weights"] = full_state_dict(actor.engine.model)
    return st


def load_roles_state(st: dict[str, Any], roles: dict[str, Any]) -> None:
    """Load :func:`roles_state` into ``roles``; the engine gets its saved weights (a lagging
    copy) or the actor's (vLLM: its weights are not in checkpoints, and an engine that does not
    share the actor's model must not keep generating from the weights it started with)."""
    for name, wk in roles.items():
        if wk is not None and st.get(name) is not None:
            try:
                wk.load_state_dict(st[name])
            except (RuntimeError, KeyError, ValueError, TypeError) as exc:
                # tensors of another shape or names (another model's weights under a
                # checksum anyone can forge): a CheckpointError, not a state_dict traceback
                first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
                raise CheckpointError(
                    f"the saved {name} state does not fit this run's {name} "
                    f"({type(exc).__name__}: {first})"
                ) from None
    actor = roles.get("actor")
    if actor is None:
        return
    eng = actor.engine
    if st.get("engine_weights") is not None and getattr(eng, "model", None) is not actor.lm:
        eng.update_weights(st["engine_weights"], int(st["engine_version"]))
    if hasattr(eng, "model"):
        eng.policy_version = int(st.get("engine_version", actor.policy_version))
    else:  # vLLM: it restarts from the actor's weights
        from rpeg.runtime.actors.weight_sync import load_engine_from_actor

        load_engine_from_actor(eng, actor)


# --------------------------------------------------------------------------- one rank's state
def rank_state_bytes(rank: int, group: str, roles: dict[str, Any], light: bool = False) -> bytes:
    """One rank's state file (:func:`dumps`: safetensors + JSON, no pickle): its rank, group
    and :func:`roles_state`."""
    return dumps({"rank": rank, "group": group, **roles_state(roles, light)})


def load_rank_state_bytes(data: bytes, roles: dict[str, Any]) -> None:
    """Load :func:`rank_state_bytes` into ``roles`` (:func:`load_roles_state`)."""
    load_roles_state(loads(data), roles)
