"""The one role builder of the local trainer and the rank actors (rpeg.runtime.role_builder)."""

import math

import pytest
import torch

from rpeg.config import RunConfig
from rpeg.runtime.engines.torch_engine import TorchEngine
from rpeg.runtime.role_builder import ROLE_NAMES, all_roles, build_roles, greedy_accuracy

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}


def _cfg(**over):
    base = {
        "model.tiny_shape": SMALL,
        "optim.warmup_sft_steps": 0,
        "task.heldout_size": 4,
        "workload.num_prompts": 2,
        "workload.samples_per_prompt": 2,
        "workload.max_response_tokens": 4,
    }
    base.update(over)
    return RunConfig().with_overrides(base)


@pytest.mark.parametrize(
    ("over", "want"),
    [
        ({"algorithm.name": "grpo", "algorithm.use_reference": False}, ("actor",)),
        ({"algorithm.name": "grpo", "algorithm.use_reference": True}, ("actor", "reference")),
        (
            {"algorithm.name": "ppo", "algorithm.use_reference": False},
            ("actor", "critic"),
        ),
        (
            {
                "algorithm.name": "ppo",
                "algorithm.use_reference": True,
                "algorithm.share_actor_critic": True,
            },
            ("actor", "reference"),
        ),
    ],
)
def test_all_roles_follow_the_algorithm(over, want):
    assert all_roles(_cfg(**over)) == want


def test_reference_and_critic_start_from_the_actor_weights_in_their_own_tensors():
    cfg = _cfg(**{"algorithm.name": "ppo", "algorithm.use_reference": True})
    built = build_roles(cfg, ROLE_NAMES, engine="torch")
    actor = dict(built.actor.lm.named_parameters())
    ref = dict(built.reference.lm.named_parameters())
    assert actor.keys() == ref.keys()
    for k, p in actor.items():
        assert torch.equal(p, ref[k]) and p.data_ptr() != ref[k].data_ptr()
    trunk = dict(built.critic.module.trunk.named_parameters())
    shared = [k for k in trunk if f"model.{k}" in actor]
    assert shared, "the critic's trunk is the actor's model"
    for k in shared:
        assert torch.equal(trunk[k], actor[f"model.{k}"])
    assert built.reference.optimizer is None and built.actor.optimizer is not None
    assert len(built.heldout) == 4


def test_only_the_named_roles_and_a_frozen_actor():
    cfg = _cfg(**{"algorithm.name": "grpo", "algorithm.use_reference": True})
    built = build_roles(cfg, ("actor",), engine="torch", actor_trainable=False)
    assert built.reference is None and built.critic is None
    assert built.actor.optimizer is None
    # no lagging copy asked: generation runs on the actor's own model
    assert isinstance(built.actor.engine, TorchEngine)
    assert built.actor.engine.model is built.actor.lm


def test_a_lagging_engine_holds_its_own_copy_of_the_weights():
    built = build_roles(_cfg(), ("actor",), engine="torch", lagging_engine=True)
    eng = built.actor.engine
    assert eng.model is not built.actor.lm
    own = dict(eng.model.named_parameters())
    for k, p in built.actor.lm.named_parameters():
        assert torch.equal(p, own[k]) and p.data_ptr() != own[k].data_ptr()


def test_place_runs_before_the_roles_copy_the_model():
    cfg = _cfg(**{"algorithm.use_reference": True})

    # place moves the model (a rank's device); its dtype is the precision rule's
    # (rpeg.runtime.precision), so the mark here is a value every copy must carry
    def place(m):
        with torch.no_grad():
            m.model.embed_tokens.weight.fill_(0.5)

    built = build_roles(cfg, ("actor", "reference"), engine="torch", place=place)
    assert bool((built.actor.lm.model.embed_tokens.weight == 0.5).all())
    assert bool((built.reference.lm.model.embed_tokens.weight == 0.5).all())


def test_the_engine_is_built_only_for_the_actor():
    # vllm is not installed here: a process without the actor builds no engine at all
    cfg = _cfg(**{"algorithm.use_reference": True})
    built = build_roles(cfg, ("reference",), engine="vllm")
    assert built.actor is None and built.reference is not None


def test_an_unknown_role_is_refused_naming_the_allowed_ones():
    with pytest.raises(ValueError, match="rollout.*actor, reference, critic"):
        build_roles(_cfg(), ("actor", "rollout"), engine="torch")


def test_greedy_accuracy_without_examples_is_nan():
    built = build_roles(_cfg(), ("actor",), engine="torch")
    acc = greedy_accuracy(built.actor, built.tokenizer, [], built.rewards, "{question}")
    assert math.isnan(acc)


def test_greedy_accuracy_does_not_touch_the_actors_engine():
    built = build_roles(_cfg(), ("actor",), engine="torch", lagging_engine=True)
    eng = built.actor.engine
    acc = greedy_accuracy(
        built.actor, built.tokenizer, built.heldout, built.rewards, _cfg().task.prompt_template
    )
    assert 0.0 <= acc <= 1.0
    assert built.actor.engine is eng
