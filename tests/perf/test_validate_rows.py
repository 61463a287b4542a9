"""Reading validation rows the project has never seen: every row either gets a prediction or
is listed with the reason it did not, whatever its cells hold (never a crash that loses the
other rows)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rpeg.perf.validation.published import read_rows, row_case, validate_rows

ROWS = read_rows()  # the data set shipped in the package
BASE = next(r for r in ROWS if r["case_id"] == "nemo-v0.5-h100bf16-llama-grpo-on-16g")


def _row(**cells):
    r = dict(BASE)
    r.update(cells)
    return r


def _one(**cells):
    rep = validate_rows([_row(case_id="x", **cells)])
    (res,) = rep.rows
    return res


def test_critic_row_prices_value_forward_and_critic_update():
    base = _one().prediction
    ppo = _one(has_critic="yes").prediction
    assert "train_critic" in ppo.stages and "values" in ppo.stages
    assert "train_critic" not in base.stages
    # the critic is the actor's architecture: its update costs about what the actor's does
    ratio = ppo.stages["train_critic"].time_s / ppo.stages["train_actor"].time_s
    assert 0.7 < ratio < 1.3
    assert ppo.step_s > base.step_s + 0.5 * ppo.stages["train_critic"].time_s


def test_colocated_row_with_blank_pool_sizes_uses_every_gpu():
    full = _one().predicted_step_s
    blank = _one(gen_gpus="", train_gpus="").predicted_step_s
    assert blank == full


def test_colocated_row_pools_that_differ_from_its_one_pool_are_named():
    # "16k" GPUs (a length's suffix on a count) beside pools of 16: not silently 16,000 GPUs
    res = _one(num_gpus="16k")
    assert res.prediction is None
    assert "placement=colocated shares one pool of num_gpus=16000" in res.reason
    assert "gen_gpus=16, train_gpus=16" in res.reason
    res = _one(train_gpus="8")
    assert res.prediction is None and res.reason.endswith("or placement=disaggregated")
    assert "num_gpus=16, but gen_gpus=16, train_gpus=8" in res.reason


def test_a_bad_gpu_count_is_named_before_the_throughput_it_scales():
    (res,) = validate_rows([_row(case_id="x", num_gpus="-16")]).skipped
    assert "num_gpus=-16: must be >= 1" in res.reason and "throughput" not in res.reason


def test_disaggregated_row_pool_sizes_must_add_up_or_are_solved():
    res = _one(placement="disaggregated", gen_gpus="")  # train_gpus=16 leaves no gen pool
    assert res.prediction is None and "must be two pools of num_gpus=16" in res.reason
    res = _one(placement="disaggregated", gen_gpus="", train_gpus="")
    assert res.prediction is not None
    assert set(res.solved) >= {"gen_gpus", "train_gpus"}
    assert res.solved["gen_gpus"] + res.solved["train_gpus"] == 16
    res = _one(placement="disaggregated", gen_gpus="4", train_gpus="")
    assert res.prediction is not None and res.solved == {}  # 12 follows from the total
    # one GPU cannot hold two pools: named before any layout is tried
    res = _one(placement="disaggregated", num_gpus="1", gen_gpus="", train_gpus="")
    assert res.prediction is None
    assert "placement=disaggregated needs two pools" in res.reason and "num_gpus=1" in res.reason


def test_annotated_numbers_are_read_and_garbage_is_named():
    assert _one(num_gpus="16 (inferred)").predicted_step_s == _one().predicted_step_s
    res = _one(train_tp="two")
    assert res.prediction is None and "train_tp='two' is not a number" in res.reason


def test_layout_errors_are_one_line_reasons_naming_the_cells():
    res = _one(train_tp="3", train_pp="", train_cp="", train_gpus="")
    assert res.prediction is None
    assert res.reason == "train_tp=3 must divide the train pool's 16 GPUs (num_gpus=16)"
    res = _one(train_tp="4", train_pp="2", train_cp="4")
    assert res.reason.startswith("train_tp=4 x train_pp=2 x train_cp=4 = 32 must divide")
    res = _one(placement="disaggregated", gen_gpus="6", train_gpus="10", gen_tp="4", gen_pp="")
    assert res.reason == "gen_tp=4 must divide the gen pool's 6 GPUs (gen_gpus=6)"
    # a pool that follows from the others is named as such
    res = _one(placement="disaggregated", gen_gpus="6", train_gpus="", train_tp="4", train_pp="")
    assert "train pool's 10 GPUs (train_gpus=10)" in res.reason
    assert "\n" not in res.reason


def test_a_split_the_model_does_not_allow_is_named_with_the_allowed_values():
    # BASE: Llama-3.1-8B (32 heads, 32 layers, dense) on 16 GPUs
    res = _one(train_tp="", train_pp="", train_cp="", gen_tp="", gen_pp="")
    assert res.prediction is not None
    res = _one(gen_tp="16", gen_pp="")
    assert res.prediction is not None  # 16 divides 32 heads and the pool
    for cells, reason in (
        (
            dict(gen_tp="3", gen_gpus="", train_gpus="", num_gpus="12", placement="colocated",
                 gen_pp="", train_tp="", train_pp="", train_cp=""),
            "gen_tp=3 must divide llama3.1-8b's 32 attention heads; allowed: 1, 2, 4, 8, 16, 32",
        ),
        (
            dict(train_tp="", train_pp="64", train_cp="", train_gpus="", num_gpus="64",
                 gen_gpus="", placement="colocated"),
            "train_pp=64 exceeds llama3.1-8b's 32 decoder layers; allowed: 1-32",
        ),
        (dict(train_ep="2"), "train_ep=2: llama3.1-8b has no routed experts; allowed: 1 or blank"),
    ):  # fmt: skip
        res = _one(**cells)
        assert res.prediction is None and res.reason == reason


def test_a_stand_in_architecture_does_not_refuse_a_stated_split():
    # "Acme-14B" is priced as a resized catalog entry with 40 heads: its own heads are
    # unknown, so a stated TP 16 is priced, not refused against the stand-in's
    res = _one(model="Acme-14B", gen_tp="16", gen_pp="", train_tp="", train_pp="")
    assert "model" in res.unknown and res.prediction is not None


def test_an_expert_split_must_divide_the_experts():
    res = _one(model="qwen3-30b-a3b", train_ep="3", train_backend="megatron")
    assert res.prediction is None
    assert res.reason.startswith("train_ep=3 must divide qwen3-30b-a3b's 128 routed experts")
    # 8 divides the experts (and the trainer's 8 data-parallel ranks at PP 2): priced
    assert _one(model="qwen3-30b-a3b", train_ep="8", gen_tp="").prediction is not None


def test_placement_is_checked():
    res = _one(placement="hybrid")
    assert "allowed: colocated, disaggregated" in res.reason


def test_gpus_per_node_picks_a_matching_catalog_cluster():
    _, plan, _ = row_case(_row(gpus_per_node="8"))
    assert plan.cluster == "dgx-h100"
    # no 4-GPU H100 node in the catalog: dgx-h100's links with 4 GPUs a node (derived)
    _, plan, _ = row_case(_row(gpus_per_node="4"))
    assert plan.cluster == "dgx-h100-4-per-node"
    res = _one(gpus_per_node="4")
    assert res.prediction is not None


def test_gb200_rows_keep_the_nvl72_cluster():
    _, plan, _ = row_case(_row(gpu="gb200", gpus_per_node="4"))
    assert plan.cluster == "gb200-nvl72"


def test_zero3_backends_are_priced_as_sharded_data_parallel():
    _, plan, _ = row_case(_row(train_backend="deepspeed (ZeRO-3)"))
    assert plan.units["train_actor"].engine == "fsdp"
    _, plan, _ = row_case(_row(train_backend="megatron"))
    assert plan.units["train_actor"].engine == "megatron"


def test_a_catalog_model_with_assumed_parts_is_predicted_and_says_what_it_assumed():
    # qwen3.5-9b's catalog entry is partly assumed (layer count, linear-attention heads,
    # vision tower: its `source` says so); the row is predicted, never refused, and the
    # prediction lists the model-kind priors it leaned on
    res = _one(model="qwen3.5-9b")
    assert res.prediction is not None and res.error is not None
    assert any("qwen3.5-9b" in a for a in res.prediction.assumptions)


def test_throughput_only_row_per_gpu():
    res = _one(measured_step_s="", measured_other="tokens_per_s_per_gpu=1000")
    assert res.measured_throughput == 16 * 1000
    assert res.prediction is not None and res.error is None


_CELLS = [
    "num_gpus",
    "gen_gpus",
    "train_gpus",
    "gen_tp",
    "gen_pp",
    "train_tp",
    "train_pp",
    "train_cp",
    "train_ep",
    "num_prompts",
    "samples_per_prompt",
    "train_minibatches",
    "avg_prompt_len",
    "avg_gen_len",
    "max_gen_len",
    "max_seq_len",
    "staleness",
    "placement",
    "partial_rollout",
    "has_ref",
    "has_critic",
    "precision",
    "train_backend",
    "measured_step_s",
    "gpus_per_node",
    "gpu_memory_utilization",
    "act_ckpt",
    "seq_packing",
    "streaming",
    "reuse_rollout_logprobs",
    "gen_cap",
]
_VALUES = st.sampled_from(
    ["", "0", "1", "2", "3", "8", "16", "-4", "1e9", "0.5", "abc", "inf", "yes", "no", "8 (x)"]
    + ["colocated", "disaggregated", "fp8", "fsdp2", "megatron", "100000"]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(_CELLS), _VALUES, max_size=4))
def test_any_cells_give_a_prediction_or_a_reason(cells):
    rep = validate_rows([_row(case_id="fuzz", **cells), dict(BASE)])
    fuzz, base = rep.rows
    assert base.prediction is not None  # the other row is never lost
    if fuzz.prediction is None:
        assert fuzz.reason
    else:
        assert fuzz.prediction.step_s > 0


def test_absurd_sizes_are_refused_not_allocated():
    res = _one(num_gpus="1e9")
    assert res.prediction is None and "num_gpus=1000000000: at most 1,048,576 GPUs" in res.reason
    # pools that name the slip: the count they add up to is named by its cells
    res = _one(num_gpus="", placement="disaggregated", gen_gpus="1e9", train_gpus="8")
    assert res.prediction is None
    assert "gen_gpus + train_gpus=1000000008: at most 1,048,576 GPUs" in res.reason
    at_limit = _one(num_gpus=str(1 << 20), placement="colocated", gen_gpus="", train_gpus="")
    assert at_limit.prediction is not None  # the limit


def test_precision_and_measurement_are_checked():
    assert "allowed: bf16, fp16, fp8, fp32" in _one(precision="int3").reason
    assert "measured_step_s=-3: must be a positive number" in _one(measured_step_s="-3").reason
    # more than a week for one step is a unit slip (ms, hours), named with the allowed range
    week = _one(measured_step_s="1e30")
    assert week.prediction is None and "allowed: seconds in (0, 604800]" in week.reason
    assert _one(measured_step_s="6 days").prediction is None  # a unit it does not read
    assert _one(measured_step_s=str(6 * 86400)).prediction is not None


def test_a_count_that_is_not_whole_is_named_not_truncated():
    for col, value in (("num_gpus", "16.5"), ("num_prompts", "63.2"), ("gen_tp", "1.5")):
        res = _one(**{col: value})
        assert res.prediction is None, col
        assert f"{col}={value}: must be a whole number >= 1" in res.reason
    assert _one(num_prompts="64.0").prediction is not None  # a whole number written as a float
    assert "max_gen_len=0: must be >= 1" in _one(max_gen_len="0").reason


def test_blank_has_critic_follows_the_algorithm():
    assert "train_critic" in _one(has_critic="", algorithm="ppo").prediction.stages
    assert "train_critic" not in _one(has_critic="", algorithm="grpo").prediction.stages
    assert "train_critic" not in _one(has_critic="no", algorithm="ppo").prediction.stages
    # value-based names train a critic; a name that says it has none does not
    for algo in ("PPO (GAE)", "VAPO", "ppo w/ critic"):
        assert "train_critic" in _one(has_critic="", algorithm=algo).prediction.stages, algo
    for algo in ("ppo (no critic)", "ppo-grpo-style (no critic)", "RLOO", "REINFORCE++"):
        assert "train_critic" not in _one(has_critic="", algorithm=algo).prediction.stages, algo


def test_blank_has_ref_follows_the_algorithm_then_the_system():
    def ref(**cells):
        res = _one(has_ref="", **cells)
        assert "has_ref" in res.unknown
        return "ref_logprob" in res.prediction.stages

    # BASE is a NeMo-RL row: its recipes keep a KL penalty to the reference policy
    assert ref() and ref(algorithm="grpo")
    assert not ref(algorithm="GRPO (no KL)") and not ref(algorithm="grpo kl=0")
    # verl creates a reference only when a KL term is asked for
    verl = dict(
        source="a verl report", measured_by="", system="", notes="verl run", train_backend="fsdp"
    )
    assert not ref(**verl) and ref(**verl, algorithm="GRPO + KL loss")
    assert ref(**verl, algorithm="grpo kl=0.001")
    # a stated cell wins
    assert "ref_logprob" not in _one(has_ref="no").prediction.stages


def test_yes_no_columns_are_checked_and_blank_means_unknown():
    assert "act_ckpt='maybe'; allowed: yes, no, or blank" in _one(act_ckpt="maybe").reason
    # the graph's columns too (read as "no" before, silently)
    for col in ("has_ref", "has_critic", "partial_rollout"):
        assert f"{col}='maybe'; allowed: yes, no, or blank" in _one(**{col: "maybe"}).reason
    assert _one(staleness="", partial_rollout="sometimes").prediction is None
    res = _one(act_ckpt="", seq_packing="")
    assert {"act_ckpt", "seq_packing"} <= set(res.unknown)
    # activation recompute costs a fourth pass: the published "no" is faster than "yes"
    assert _one(act_ckpt="no").predicted_step_s < _one(act_ckpt="yes").predicted_step_s


def test_fractional_staleness_is_asynchronous():
    # verl's staleness_threshold (a share of the step's samples) still lets the rollout run
    # ahead by up to one version: priced like k = 1, not as a synchronous step
    base = dict(placement="disaggregated", gen_gpus="8", train_gpus="8", partial_rollout="yes")
    k0 = _one(**base, staleness="0").predicted_step_s
    half = _one(**base, staleness="0.5").predicted_step_s
    k1 = _one(**base, staleness="1").predicted_step_s
    assert half == k1 < k0


def test_response_cap_stays_inside_the_sequence_budget():
    _, _, wl = row_case(_row(max_gen_len="4096", max_seq_len="4096", avg_prompt_len="100"))
    assert wl.max_response_tokens == 3996
    _, _, wl = row_case(_row(max_gen_len="4096", max_seq_len="", gen_cap="2000"))
    assert wl.max_response_tokens == 2000


def test_blank_total_and_placement_follow_from_the_pools():
    base = _one().predicted_step_s
    assert _one(num_gpus="").predicted_step_s == base  # colocated 16 + 16 on the same 16
    res = _one(placement="", num_gpus="", gen_gpus="4", train_gpus="12")
    assert res.prediction is not None and res.prediction.num_devices == 16
    assert "placement" in res.unknown
    assert len({s.devices for s in res.prediction.stages.values()}) == 2  # two pools


def test_a_batch_the_notes_state_is_read_and_one_nobody_states_is_named():
    stated = _one().predicted_step_s
    via_text = _one(
        num_prompts="",
        samples_per_prompt="",
        notes=f"{BASE['notes']} num_prompts_per_step={BASE['num_prompts']} "
        f"num_generations_per_prompt={BASE['samples_per_prompt']}",
    )
    assert via_text.predicted_step_s == stated
    res = _one(num_prompts="", samples_per_prompt="")
    assert res.prediction is None
    assert res.reason == "num_prompts and samples_per_prompt not published"


def test_ppo_with_a_critic_samples_one_response_per_prompt_unless_stated():
    one = _one(has_critic="yes", samples_per_prompt="1")
    blank = _one(has_critic="yes", samples_per_prompt="")
    assert blank.predicted_step_s == one.predicted_step_s
    assert "samples_per_prompt" in blank.unknown
    # a group-baseline algorithm has no default group size
    res = _one(has_critic="no", samples_per_prompt="")
    assert res.prediction is None and res.reason == "samples_per_prompt not published"


def test_an_offline_method_is_named_not_priced_as_rl():
    for algo in ("SFT", "dpo", "KTO", "reward model training"):
        res = _one(algorithm=algo)
        assert res.prediction is None
        assert f"algorithm={algo.lower()!r} trains offline" in res.reason
        assert "allowed: an RL algorithm" in res.reason
    # online variants generate: priced; an RL name that contains an offline one is not matched
    for algo in ("online dpo", "iterative DPO", "grpo", "ppo (sft init)", "dapo"):
        assert _one(algorithm=algo).prediction is not None, algo
