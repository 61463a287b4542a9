"""Where each recipe puts the KL to the reference, on tensors worked out by hand.

The batch: 2 samples of one prompt (K = 2), 2 response tokens each, rewards [1, 0];
old log-probs -1 everywhere, reference log-probs [[-1.5, -1], [-1, -1]]. With the k1
estimator (KL_t = logp - ref) the per-token KL is [[0.5, 0], [0, 0]]: 0.5 summed over
sample 0, 0.125 as a token mean. kl_coef = 0.2.
"""

import math

import pytest
import torch

from rpeg.compile.sources import graph_from_config
from rpeg.config import AlgorithmConfig, RunConfig
from rpeg.ir import RECIPE_NAMES, RECIPES, GraphError
from rpeg.runtime.batch import RolloutBatch
from rpeg.runtime.parallel import LOCAL
from rpeg.runtime.recipes import RUNTIME_RECIPES, actor_loss, runtime_recipe
from rpeg.runtime.stages import advantage_stage

OLD = torch.full((2, 2), -1.0)
REF = torch.tensor([[-1.5, -1.0], [-1.0, -1.0]])


def _batch(*, ref: bool = True) -> RolloutBatch:
    return RolloutBatch(
        prompt_ids=torch.ones((2, 1), dtype=torch.long),
        prompt_mask=torch.ones((2, 1), dtype=torch.long),
        response_ids=torch.ones((2, 2), dtype=torch.long),
        response_mask=torch.ones((2, 2), dtype=torch.long),
        sample_logprobs=OLD.clone(),
        policy_version=torch.zeros(2, dtype=torch.long),
        group_ids=torch.zeros(2, dtype=torch.long),
        rewards=torch.tensor([1.0, 0.0]),
        old_logprobs=OLD.clone(),
        ref_logprobs=REF.clone() if ref else None,
        values=torch.zeros((2, 2)),
    )


def _cfg(name: str, kl_coef: float) -> AlgorithmConfig:
    return AlgorithmConfig(name=name, kl_coef=kl_coef, kl_estimator="k1", gae_lambda=1.0)


def _adv(name: str, kl_coef: float, *, ref: bool = True) -> RolloutBatch:
    return advantage_stage(_batch(ref=ref), _cfg(name, kl_coef), 2)[0]


def _whitened(g: list[float]) -> torch.Tensor:
    """(g - mean) / sqrt(biased var) over the 4 tokens, worked from the list."""
    m = sum(g) / 4
    sd = math.sqrt(sum((x - m) ** 2 for x in g) / 4)
    return torch.tensor([(x - m) / sd for x in g]).view(2, 2)


def test_every_recipe_has_its_runtime_math():
    assert tuple(RUNTIME_RECIPES) == RECIPE_NAMES
    assert runtime_recipe("REINFORCE++").name == "reinforce_pp"


# --- KL in the reward: the advantage changes ------------------------------------------------
def test_rloo_kl_in_the_reward_per_sequence():
    # r' = r - 0.2 * sum_t KL_t = [1 - 0.1, 0]; K = 2: A_0 = 0.9 - 0 = 0.9, A_1 = -0.9
    b = _adv("rloo", 0.2)
    torch.testing.assert_close(b.advantages, torch.tensor([[0.9, 0.9], [-0.9, -0.9]]))
    torch.testing.assert_close(_adv("rloo", 0.0).advantages, torch.tensor([[1.0, 1], [-1, -1]]))


def test_reinforce_pp_kl_in_the_reward_per_token():
    # token rewards: row 0 [-0.2 * 0.5, 1] = [-0.1, 1], row 1 [0, 0]; returns (gamma 1):
    # row 0 [0.9, 1.0], row 1 [0, 0]; whitened over the 4 tokens (mean 0.475)
    b = _adv("reinforce_pp", 0.2)
    torch.testing.assert_close(b.advantages, _whitened([0.9, 1.0, 0.0, 0.0]), atol=1e-5, rtol=0)
    # without KL: returns [1, 1, 0, 0] -> mean 0.5, std 0.5 -> [1, 1, -1, -1]
    torch.testing.assert_close(
        _adv("reinforce_pp", 0.0).advantages, torch.tensor([[1.0, 1], [-1, -1]]), atol=1e-5, rtol=0
    )


def test_ppo_kl_in_the_reward_per_token():
    # values 0, gamma = lambda = 1: GAE = the return of the token rewards [-0.1, 1] / [0, 0]
    b = _adv("ppo", 0.2)
    torch.testing.assert_close(b.returns, torch.tensor([[0.9, 1.0], [0.0, 0.0]]))
    torch.testing.assert_close(b.advantages, _whitened([0.9, 1.0, 0.0, 0.0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(_adv("ppo", 0.0).returns, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))


# --- KL in the loss or nowhere: the advantage does not see it -------------------------------
@pytest.mark.parametrize(
    "name, a0",
    [
        # group [1, 0]: mean 0.5, unbiased std sqrt(0.5): A = +-0.5 / 0.70711 = +-0.70711
        ("grpo", 0.5 / math.sqrt(0.5)),
        ("dapo", 0.5 / math.sqrt(0.5)),
        # Dr.GRPO: no std, A = +-0.5
        ("dr_grpo", 0.5),
    ],
)
def test_group_recipes_keep_kl_out_of_the_advantage(name, a0):
    want = torch.tensor([[a0, a0], [-a0, -a0]])
    for kl_coef in (0.0, 0.2):
        torch.testing.assert_close(_adv(name, kl_coef).advantages, want, atol=1e-5, rtol=0)


# --- the loss: KL added only where the recipe puts it ---------------------------------------
def _loss(name: str, kl_coef: float) -> tuple[float, dict]:
    """The actor loss at the old weights (ratio 1) on fixed advantages [[1, 1], [-1, -1]]:
    the surrogate is -mean(A) = 0, so the loss is the KL term alone."""
    micro = _batch().replace(advantages=torch.tensor([[1.0, 1.0], [-1.0, -1.0]]))
    loss, m = actor_loss(runtime_recipe(name), _cfg(name, kl_coef), micro, OLD, torch.zeros(2, 2))
    return float(loss), m


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_kl_enters_the_loss_only_for_loss_recipes(name):
    # KL_t(current = old, ref) = [[0.5, 0], [0, 0]]: token mean 0.125; x 0.2 = 0.025
    want = 0.025 if name in ("grpo", "dr_grpo") else 0.0
    loss, m = _loss(name, 0.2)
    assert loss == pytest.approx(want, abs=1e-7)
    assert _loss(name, 0.0)[0] == pytest.approx(0.0, abs=1e-7)
    assert m["kl"] == pytest.approx(0.125)  # reported wherever there is a reference


def test_kl_in_the_loss_is_differentiated():
    # d/dlp of 0.2 * mean_t(lp - ref) = 0.2 / 4 per token (advantages 0: no surrogate gradient)
    lp = OLD.clone().requires_grad_(True)
    micro = _batch().replace(advantages=torch.zeros(2, 2))
    loss, _ = actor_loss(runtime_recipe("grpo"), _cfg("grpo", 0.2), micro, lp, torch.zeros(2, 2))
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.full((2, 2), 0.05))


def test_reinforce_pp_counts_kl_once():
    """The advantage takes the KL (reward); the loss on those advantages adds nothing more:
    the same loss as with kl_coef 0 in the loss term."""
    cfg = _cfg("reinforce_pp", 0.2)
    b, _ = advantage_stage(_batch(), cfg, 2, reduce=LOCAL)
    lp = OLD + torch.tensor([[0.1, 0.0], [0.0, -0.1]])  # ratio != 1: the surrogate is not 0
    rec = runtime_recipe("reinforce_pp")
    with_kl, _ = actor_loss(rec, cfg, b, lp, torch.zeros(2, 2))
    no_loss_kl, _ = actor_loss(rec, _cfg("reinforce_pp", 0.0), b, lp, torch.zeros(2, 2))
    assert float(with_kl) == pytest.approx(float(no_loss_kl), abs=1e-7)
    # and the advantages did take it: they differ from kl_coef 0's
    assert not torch.allclose(b.advantages, _adv("reinforce_pp", 0.0).advantages)


def test_reward_kl_needs_the_reference():
    # no reference log-probs: nothing to subtract, RLOO's advantage is the plain one
    torch.testing.assert_close(
        _adv("rloo", 0.2, ref=False).advantages, torch.tensor([[1.0, 1], [-1, -1]])
    )


# --- from the config: the graph and one local step per recipe -------------------------------
def _run_cfg(name: str, tmp_path, **over) -> RunConfig:
    base = {
        "workload.num_prompts": 2,
        "workload.samples_per_prompt": 2,
        "workload.max_response_tokens": 4,
        "workload.micro_batch_size": 4,
        "workload.train_minibatches": 1,
        "task.heldout_size": 2,
        "runtime.steps": 1,
        "model.tiny_shape": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1},
        "optim.warmup_sft_steps": 0,
        "algorithm.name": name,
        "runtime.output_dir": str(tmp_path / name),
    }
    return RunConfig().with_overrides({**base, **over})


def test_config_graph_takes_group_size_and_refuses_kl_for_dapo(tmp_path):
    for name in RECIPE_NAMES:
        cfg = _run_cfg(name, tmp_path, **{"workload.samples_per_prompt": 4})
        g = graph_from_config(cfg)
        assert g.algorithm == name and g.params["group_size"] == 4
        assert g.params["kl_placement"] == RECIPES[name].kl
    with pytest.raises(GraphError) as e:
        graph_from_config(_run_cfg("dapo", tmp_path, **{"algorithm.kl_coef": 0.1}))
    assert "dapo.kl_coef" in str(e.value)


def test_one_local_step_of_every_recipe(tmp_path, monkeypatch):
    """Each recipe's step runs from the config: a reference where its KL can go, a critic
    where it has one (about 15 s on 2 cores, most of it the first model build)."""
    monkeypatch.setenv("RPEG_CACHE", str(tmp_path / "cache"))
    from rpeg.runtime.local_trainer import LocalTrainer

    for name in RECIPE_NAMES:
        r = RECIPES[name]
        kl = 0.0 if r.kl == "none" else 0.1
        tr = LocalTrainer(_run_cfg(name, tmp_path, **{"algorithm.kl_coef": kl}))
        m = tr.step()
        assert (tr.reference is not None) is r.uses_reference, name
        assert (tr.critic is not None) is r.critic, name
        assert ("kl" in m) is r.uses_reference and math.isfinite(m["advantage_abs_mean"]), name
