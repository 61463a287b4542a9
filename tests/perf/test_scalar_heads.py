"""A critic's and a learned reward model's passes end in a value head (hidden -> 1) where
the actor has its LM head (rpeg.perf.passes.SCALAR_HEAD_KINDS): no vocabulary projection,
no log-softmax over the vocabulary, no logits held. RPEG's own critic drops the LM head the
same way (rpeg.runtime.model_io.CriticModel), as verl's and OpenRLHF's one-label critics do."""

import pytest
from schema_rows import schema_row

from rpeg.perf.calibration import SHIPPED
from rpeg.perf.validation.rows import read_case
from rpeg.perf.validation.solve import solve_row
from rpeg.specs import model as model_spec


@pytest.fixture(scope="module")
def ppo():
    # an OpenRLHF-style PPO of a small, large-vocabulary model: actor, critic, reference and
    # a reward model of one architecture on 8 H100
    row = schema_row(
        {},
        case_id="ppo",
        source="OpenRLHF report",
        model="qwen2.5-1.5b-instruct",
        gpu="h100",
        num_gpus=8,
        gpus_per_node=8,
        placement="colocated",
        algorithm="ppo",
        has_critic="yes",
        has_ref="yes",
        reward_model="yes",
        train_backend="deepspeed",
        num_prompts=64,
        samples_per_prompt=1,
        avg_prompt_len=256,
        avg_gen_len=512,
        max_gen_len=1024,
        measured_step_s=100,
    )
    return solve_row(read_case(row), SHIPPED)[2].stages


def test_scalar_head_passes_hold_no_logits(ppo):
    for name in ("values", "train_critic", "reward"):
        assert ppo[name].memory_gb["logits"] == 0.0, name
    for name in ("old_logprob", "ref_logprob", "train_actor"):
        assert ppo[name].memory_gb["logits"] > 0.0, name


def test_a_critic_pass_costs_the_actors_less_its_lm_head(ppo):
    m = model_spec("qwen2.5-1.5b-instruct")
    head_share = m.vocab * m.hidden / m.matmul_params  # ~15% of the matmuls for this model
    assert 0.1 < head_share < 0.2
    for critic, actor in (("values", "old_logprob"), ("train_critic", "train_actor")):
        c, a = ppo[critic], ppo[actor]
        assert "vocab_s" in a.detail and "vocab_s" not in c.detail
        # same tokens, same layout, same trunk: cheaper by the head's GEMMs and the softmax,
        # never by more than the actor's own head share plus its vocabulary pass
        saved = a.time_s - c.time_s
        assert 0 < saved <= head_share * a.time_s + a.detail["vocab_s"] + 1e-9, critic
