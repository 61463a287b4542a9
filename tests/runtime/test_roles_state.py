"""One role-state format for both runtimes (rpeg.runtime.actors.checkpoint.rank_state): what
an engine gets back on resume, whether it shares the actor's model, lags with its own copy, or
holds no model the checkpoint could carry (vLLM)."""

from __future__ import annotations

import torch

from rpeg.runtime.actors.checkpoint import load_roles_state, roles_state


class _Engine:
    """An engine without a ``model`` (as VLLMEngine): weights only through update_weights
    (a state dict) or update_from (a trainer's ``(meta, fetch)`` source, fetched here)."""

    def __init__(self) -> None:
        self.policy_version = 0
        self.updates: list[tuple[dict, int]] = []

    def update_weights(self, weights: dict, version: int) -> None:
        self.updates.append((weights, version))
        self.policy_version = version

    def update_from(self, source, version: int, device=None) -> None:
        meta, fetch = source
        self.update_weights({k: fetch(k) for k in meta}, version)


class _Actor:
    def __init__(self, engine) -> None:
        self.lm = torch.nn.Linear(2, 2)
        self.engine = engine
        self.policy_version = 3
        self.loaded: dict | None = None

    def state_dict(self, weights: bool = True) -> dict:
        return {"policy_version": self.policy_version, "weights": weights}

    def load_state_dict(self, st: dict) -> None:
        self.loaded = st

    def get_weights(self) -> dict:
        return {"w": torch.ones(1)}

    def weight_source(self):
        return {"w": ((1,), torch.float32)}, lambda name: self.get_weights()[name]

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")


def test_an_engine_without_a_model_restarts_from_the_actors_weights():
    actor = _Actor(_Engine())
    actor.engine.policy_version = 3
    st = roles_state({"actor": actor, "critic": None})
    assert set(st) == {"actor", "engine_version"} and st["engine_version"] == 3
    fresh = _Actor(_Engine())  # a resumed process: the engine starts from the base weights
    load_roles_state(st, {"actor": fresh, "critic": None})
    assert fresh.loaded == {"policy_version": 3, "weights": True}
    ((weights, version),) = fresh.engine.updates
    assert version == 3 and torch.equal(weights["w"], torch.ones(1))


class _TorchEngine(_Engine):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model


def test_a_lagging_engine_copy_gets_its_own_older_weights_back():
    actor = _Actor(None)
    lagging = torch.nn.Linear(2, 2)
    with torch.no_grad():
        lagging.weight.fill_(0.5)
    actor.engine = _TorchEngine(lagging)
    actor.engine.policy_version = 2  # one version behind the actor (k = 1)
    st = roles_state({"actor": actor})
    assert st["engine_version"] == 2
    fresh = _Actor(None)
    fresh.engine = _TorchEngine(torch.nn.Linear(2, 2))
    load_roles_state(st, {"actor": fresh})
    ((weights, version),) = fresh.engine.updates
    assert version == 2 and torch.equal(weights["weight"], torch.full((2, 2), 0.5))


def test_an_engine_sharing_the_actors_model_only_takes_the_version():
    actor = _Actor(None)
    actor.engine = _TorchEngine(actor.lm)
    actor.engine.policy_version = 3
    st = roles_state({"actor": actor})
    assert "engine_weights" not in st
    fresh = _Actor(None)
    fresh.engine = _TorchEngine(fresh.lm)
    load_roles_state(st, {"actor": fresh})
    assert fresh.engine.updates == [] and fresh.engine.policy_version == 3


def test_light_state_holds_no_weights_and_an_absent_role_is_skipped():
    actor = _Actor(_Engine())
    st = roles_state({"actor": actor, "critic": None}, light=True)
    assert st == {"actor": {"policy_version": 3, "weights": False}}
    # an older local checkpoint wrote "critic": None: a present critic keeps its state
    critic = _Actor(_Engine())
    load_roles_state(
        {"actor": {"a": 1}, "critic": None, "engine_version": 3},
        {"actor": _Actor(_Engine()), "critic": critic},
    )
    assert critic.loaded is None
