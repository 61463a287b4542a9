"""One rank's state file: each present role's ``state_dict`` (actor / reference / critic), the
actor's engine version and a lagging engine copy's full weights."""

from __future__ import annotations

from typing import Any

from rpeg.runtime.actors.checkpoint.layout import dumps, loads


# --------------------------------------------------------------------------- one rank's state
def rank_state_bytes(rank: int, group: str, roles: dict[str, Any], light: bool = False) -> bytes:
    """One rank's state file (:func:`dumps`: safetensors + JSON, no pickle): each present role's
    ``state_dict`` (``roles``: actor / reference / critic, None when absent), the actor's
    engine version, and a lagging engine copy's full weights."""
    st: dict[str, Any] = {"rank": rank, "group": group}
    for name, wk in roles.items():
        if wk is not None:
            # light: no weights or optimizer state (a sharded group writes those itself:
            # RankActor.save_shards), RNG states and versions only
            st[name] = wk.state_dict(weights=False) if light else wk.state_dict()
    actor = roles.get("actor")
    if actor is not None and not light:
        st["engine_version"] = int(actor.engine.policy_version)
        if getattr(actor.engine, "model", actor.lm) is not actor.lm:
            from rpeg.runtime.sharding import full_state_dict

            st["engine_weights"] = full_state_dict(actor.engine.model)
    return dumps(st)


def load_rank_state_bytes(data: bytes, roles: dict[str, Any]) -> None:
    """Load :func:`rank_state_bytes` into ``roles``; the engine gets its saved weights (a
    lagging copy) or the actor's (vLLM: its weights are not in checkpoints)."""
    st = loads(data)
    for name, wk in roles.items():
        if wk is not None and name in st:
            wk.load_state_dict(st[name])
    actor = roles.get("actor")
    if actor is None:
        return
    eng = actor.engine
    if "engine_weights" in st and getattr(eng, "model", None) is not actor.lm:
        eng.update_weights(st["engine_weights"], st["engine_version"])
    if hasattr(eng, "model"):
        eng.policy_version = st.get("engine_version", actor.policy_version)
    else:  # vLLM: it restarts from the actor's weights
        eng.update_weights(actor.get_weights(), actor.policy_version)
