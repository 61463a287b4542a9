"""A row that leaves ``train_backend`` blank takes the trainer its system runs by default
(rpeg.perf.validation.row_text.DEFAULT_BACKEND): verl FSDP, NeMo-RL DTensor, OpenRLHF and
DeepSpeed-Chat DeepSpeed (sharded like FSDP), slime Megatron; a row naming no family stays
unattributed (the pooled factors) and is priced with replicated Megatron-style shards."""

import pytest

from rpeg.perf.validation import loso
from rpeg.perf.validation.row_text import read
from rpeg.perf.validation.rows import assumed_values, read_case
from tests.perf.schema_rows import schema_row


def _row(**cells):
    return schema_row(dict(
        case_id="fam", source="synthetic", measured_step_s="100", gpus_per_node="8",
        model="Qwen/Qwen2.5-7B-Instruct", gpu="H100", num_gpus="16", placement="colocated",
        algorithm="grpo", has_critic="no", num_prompts="128", samples_per_prompt="8",
        max_gen_len="4096", train_minibatches="1",
    ), **cells)  # fmt: skip


@pytest.mark.parametrize(
    ("source", "system", "engine"),
    [
        ("verl docs", "verl-fsdp", "fsdp"),
        ("EasyR1 baselines", "verl-fsdp", "fsdp"),  # a fork of verl
        ("NeMo-RL performance summary", "nemo-rl-dtensor", "fsdp"),
        ("OpenRLHF paper", "openrlhf-deepspeed", "fsdp"),
        ("DeepSpeed-Chat blog", "deepspeed-chat", "fsdp"),
        ("slime blog", "slime-megatron", "megatron"),
        ("a lab's report", "", "megatron"),
    ],
)
def test_a_blank_backend_takes_the_family_trainer(source, system, engine):
    case = read_case(_row(source=source))
    assert case.system == system and case.engine == engine
    assert "train_backend" in case.unknown
    assert f"train_backend={engine}" in assumed_values(case)


def test_a_stated_backend_is_kept():
    case = read_case(_row(source="verl docs", train_backend="megatron"))
    assert (case.system, case.engine) == ("verl-megatron", "megatron")
    assert "train_backend" not in case.unknown
    assert read(_row(source="NeMo-RL summary", train_backend="megatron"))["system"] == (
        "nemo-rl-megatron"
    )


def test_a_publisher_naming_no_family_takes_the_one_its_notes_name():
    paper = "Hu et al. 2024, arXiv 2405.11143"
    assert read(_row(source=paper, notes="trained with OpenRLHF (Ray, vLLM)"))["system"] == (
        "openrlhf-deepspeed"
    )
    # two families in the notes (a comparison): left unattributed
    assert "system" not in read(_row(source=paper, notes="OpenRLHF vs DeepSpeed-Chat"))
    # a publisher that names a family keeps it only when the notes name no other
    assert "system" not in read(_row(source="AReaL paper", notes="measured with verl"))


def test_a_publishers_baseline_is_the_family_its_measured_by_names():
    # the AReaL paper's Table 1 reports verl's runs beside its own: who measured with what
    # names the run's family; the publisher's own rows stay its family
    base = {"source": "AReaL paper Table 1", "train_backend": "fsdp"}
    verl = _row(**base, measured_by="AReaL authors (throughput measured with verl main)")
    assert read(verl)["system"] == "verl-fsdp"
    assert read_case(verl).system == "verl-fsdp"
    own = _row(source="AReaL paper Table 1", measured_by="AReaL authors")
    assert read(own)["system"] == "areal"
    # ambiguous stays unattributed: two families measured, notes naming a third, a source
    # naming none (then the notes decide, above)
    both = _row(**base, measured_by="AReaL authors (verl and OpenRLHF)")
    assert "system" not in read(both)
    third = _row(**base, measured_by="AReaL authors (verl)", notes="as in OpenRLHF's recipe")
    assert "system" not in read(third)


@pytest.mark.parametrize(
    ("cell", "backend", "system", "engine"),
    [
        ("verl", "", "verl-fsdp", "fsdp"),
        ("VeRL (Megatron)", "", "verl-megatron", "megatron"),
        ("verl", "Megatron-Core", "verl-megatron", "megatron"),
        ("OpenRLHF", "", "openrlhf-deepspeed", "fsdp"),
        ("slime", "", "slime-megatron", "megatron"),
        ("NeMo-RL", "", "nemo-rl-dtensor", "fsdp"),
        ("ReaLHF", "", "areal", "megatron"),
        ("roll", "", "roll", "megatron"),  # a family rpeg has no factors for: pooled
    ],
)
def test_a_stated_system_naming_a_family_is_that_family_s_system(cell, backend, system, engine):
    case = read_case(_row(source="a lab's report", system=cell, train_backend=backend))
    assert case.system == system and case.engine == engine
    priced, refused = loso.price_rows(
        [_row(source="a lab's report", system=cell, train_backend=backend)], "mine"
    )
    assert not refused and priced[0].system == system


def _trl(**cells):
    return _row(
        **{"source": "a TRL blog", "notes": "TRL GRPOTrainer run", "samples_per_prompt": ""} | cells
    )


def test_a_trl_row_takes_trls_own_defaults():
    # huggingface/trl GRPOConfig: use_vllm=False (transformers' generate: static batches of a
    # process's per_device_train_batch_size x steps_per_generation = 8, no CUDA graphs),
    # num_generations 8, max_completion_length 512, beta 0 (no reference), padding_free off
    case = read_case(_trl(max_gen_len=""))
    assert case.system == "trl" and case.engine == "fsdp"
    wl = case.workload
    assert (wl.gen_static_batch, case.enforce_eager, case.packing, case.has_ref) == (
        8,
        True,
        False,
        False,
    )
    assert (wl.samples_per_prompt, wl.max_response_tokens) == (8, 512)
    said = assumed_values(case)
    assert "samples_per_prompt=8 (trl's default)" in said and "max_gen_len=512" in said
    assert "enforce_eager=yes (transformers' generate)" in said
    # the group size is the TRL default, not refused; another family's blank still is
    priced, refused = loso.price_rows([_trl()], "mine")
    assert not refused and priced[0].system == "trl"
    _, refused = loso.price_rows([_row(source="verl docs", samples_per_prompt="")], "mine")
    assert "samples_per_prompt not published" in refused[0].reason


def test_a_trl_row_naming_vllm_generates_with_continuous_batching():
    case = read_case(_trl(notes="TRL GRPOTrainer, use_vllm=True, vllm_mode=colocate"))
    assert case.workload.gen_static_batch is None and not case.enforce_eager
    # what the row states is kept: its group size, cap, reference and packing
    case = read_case(
        _trl(samples_per_prompt="16", max_gen_len="2048", has_ref="yes", seq_packing="yes")
    )
    wl = case.workload
    assert (wl.samples_per_prompt, wl.max_response_tokens, case.has_ref, case.packing) == (
        16,
        2048,
        True,
        True,
    )
    # transformers' generate (static, eager) is slower than the same row on vLLM
    hf, _ = loso.price_rows([_trl()], "mine")
    vl, _ = loso.price_rows([_trl(notes="TRL GRPOTrainer with vLLM")], "mine")
    assert hf[0].step.min() > vl[0].step.min()


def _aligner(**cells):
    return _row(
        **{
            "source": "a report",
            "notes": "NeMo-Aligner PPO with TensorRT-LLM generation",
            "algorithm": "ppo",
            "has_critic": "yes",
            "samples_per_prompt": "1",
            "num_prompts": "512",
        }
        | cells
    )


def test_a_nemo_aligner_row_takes_its_own_defaults():
    # NVIDIA/NeMo-Aligner gpt_ppo_actor.yaml: the actor generates in static batches of
    # rollout_micro_batch_size (8) per data-parallel rank (the TRT-LLM engine's max batch, run
    # unstreamed), initial_policy_kl_penalty 0.01 (a reference), a reward model server, Megatron
    case = read_case(_aligner())
    assert (case.system, case.engine, case.workload.gen_static_batch) == (
        "nemo-aligner",
        "megatron",
        8,
    )
    assert case.has_ref and case.graph is not None
    said = assumed_values(case)
    assert "gen_batch_size=8 (static batches)" in said
    assert "reward_model" in case.unknown
    # a stated batching or batch size is kept
    assert read_case(_aligner(gen_batching="continuous")).workload.gen_static_batch is None
    assert read_case(_aligner(gen_batch_size="16")).workload.gen_static_batch == 16

    # static batches: each waits for its longest response, so on few ranks (many batches a
    # rank) the step is slower than the same row generated with continuous batching, and
    # the static step falls with the ranks faster (fewer batches a rank: NeMo-Aligner's
    # published scaling is near-linear, benchmarks/unseen_family_aligner.py)
    def steps(n, **cells):
        return loso.price_rows([_aligner(num_gpus=str(n), **cells)], "mine")[0][0].step[0, 3, 3]

    assert steps(16) > steps(16, gen_batching="continuous")
    assert steps(16) / steps(64) > steps(16, gen_batching="continuous") / steps(
        64, gen_batching="continuous"
    )


def test_nemo_aligners_engine_runs_on_the_trainers_shards():
    # NeMo-Aligner builds its TRT-LLM engine from the actor's Megatron shards (trt_llm.py
    # refit): a blank gen_tp is the trainer's TP, never a layout of its own; its stages are
    # the trainer's unless trt_llm.reshard folds them into data parallelism
    from rpeg.perf.calibration import SHIPPED
    from rpeg.perf.validation.solve import solve_row

    def layout(**cells):
        # the critic on the trainer's pool (critic_gpus=0): the pools below are the actor's
        case = read_case(_aligner(model="Llama-3.1-70B", num_gpus="32", critic_gpus="0", **cells))
        return solve_row(case, SHIPPED)[1]

    assert read_case(_aligner()).gen_from_trainer
    assert not read_case(_row(algorithm="ppo", has_critic="yes")).gen_from_trainer
    # pools of their own: not the trainer's shards
    split = _aligner(placement="disaggregated", gen_gpus="8", train_gpus="8")
    assert not read_case(split).gen_from_trainer
    tied = layout(train_tp="4", train_pp="1")
    assert (tied.gen_tp, tied.gen_pp) == (4, 1)
    # the fit's pipeline stages (70B on 32 GPUs at TP 4) carry to the engine unresharded
    fitted = layout(train_tp="4")
    assert fitted.train_pp > 1 and (fitted.gen_tp, fitted.gen_pp) == (4, fitted.train_pp)
    staged = layout(train_tp="4", train_pp="2", notes="NeMo-Aligner PPO, TRT-LLM, reshard off")
    assert (staged.gen_tp, staged.gen_pp) == (4, 2)
    folded = layout(train_tp="4", train_pp="2", notes="NeMo-Aligner PPO, TRT-LLM, reshard=True")
    assert (folded.gen_tp, folded.gen_pp) == (4, 1)
    # a stated engine layout is kept
    own = layout(train_tp="4", gen_tp="2")
    assert own.gen_tp == 2
    # the actor's static batch by its recipe name (the docs' "rollout_micro_batch_size of 16")
    said = _aligner(notes="NeMo-Aligner PPO; rollout_micro_batch_size of 16")
    assert read_case(said).workload.gen_static_batch == 16


def test_nemo_aligners_critic_and_reward_model_serve_from_nodes_of_their_own():
    # NeMo-Aligner's PPO launches the critic and the reward model as a server job on nodes
    # of its own (rlhf.rst: 8+4 ... 64+32 actor + critic nodes); the actor's nodes generate
    # and train. A blank size is a third of the nodes; the docs' words or a cell state it
    from rpeg.perf import predict
    from rpeg.perf.calibration import SHIPPED
    from rpeg.perf.validation.solve import solve_row

    big = dict(model="Llama-3.1-70B", num_gpus="96", train_tp="8", gen_tp="8")
    case = read_case(_aligner(**big))
    assert case.critic_gpus == 32 and "critic_gpus" in case.unknown
    assert "critic_gpus=32 (nemo-aligner's critic and reward-model server)" in assumed_values(case)
    assert (case.layout.gen_gpus, case.layout.train_gpus) == (64, 64)
    said = read_case(_aligner(**{**big, "notes": "NeMo-Aligner PPO, actor on 10 nodes, "
                                 "critic and reward model server on 2 nodes"}))  # fmt: skip
    assert said.critic_gpus == 16 and "critic_gpus" not in said.unknown
    # the critic's and the reward model's work on the last GPUs, the actor's on the first
    case, lay, pred = solve_row(case, SHIPPED)
    plan = case.plan(lay)
    on = {name: u.devices for name, u in plan.units.items()}
    assert set(on["train_critic"]) == set(on["values"]) == set(on["reward"]) == set(range(64, 96))
    assert set(on["train_actor"]) == set(on["generate"]) == set(range(64))
    # only the actor's GPUs generate: fewer engine replicas than on one pool of 96
    one, lay1, pred1 = solve_row(read_case(_aligner(**big, critic_gpus="0")), SHIPPED)
    assert pred.stages["generate"].detail["replicas"] == 8
    assert pred1.stages["generate"].detail["replicas"] == 12
    assert pred.stages["generate"].time_s > pred1.stages["generate"].time_s
    # the critic trains on a third of the GPUs: slower than over all 96
    assert pred.stages["train_critic"].time_s > pred1.stages["train_critic"].time_s
    assert predict(case.graph, plan, case.workload, calib=SHIPPED).step_s == pytest.approx(
        pred.step_s
    )


def test_a_critic_pool_that_cannot_be_read_is_named():
    from rpeg.perf.validation.row_cells import Unpredictable

    with pytest.raises(Unpredictable, match=r"critic_gpus=16: a critic's pool needs a critic"):
        read_case(_row(critic_gpus="16"))
    with pytest.raises(Unpredictable, match="critic_gpus=8: a critic's own pool beside"):
        read_case(
            _aligner(critic_gpus="8", placement="disaggregated", gen_gpus="8", train_gpus="8")
        )
    with pytest.raises(Unpredictable, match="critic_nodes=2: must leave the actor GPUs"):
        read_case(_aligner(critic_nodes="2"))
    with pytest.raises(
        Unpredictable,
        match=r"critic_gpus=4 \(of num_gpus=20\): the critic.s pool and the actor.s 16 GPUs",
    ):
        read_case(_aligner(num_gpus="20", critic_gpus="4", train_tp="8"))
    with pytest.raises(Unpredictable, match="critic_gpus=-8: must be >= 0"):
        read_case(_aligner(critic_gpus="-8"))
    # words that do not fit the row (4 + 4 nodes said, 32 GPUs run) are not a statement:
    # the system's share stands, as assumed; the same count in a cell is refused by name
    words = "NeMo-Aligner PPO, actor on 4 nodes, critic on 4 nodes"
    case = read_case(_aligner(num_gpus="32", notes=words))
    assert case.critic_gpus == 8 and "critic_gpus" in case.unknown
    with pytest.raises(Unpredictable, match="critic_nodes=4: must leave the actor GPUs"):
        read_case(_aligner(num_gpus="32", critic_nodes="4"))


def test_a_critic_pool_assumed_where_nothing_fits_beside_it_gives_way_to_one_pool():
    # a third of 24 GPUs (one node) cannot hold a 70B critic and reward model whatever its
    # stages: the assumed pool gives way to the critic on the trainer's pool, never a refusal
    from rpeg.perf.calibration import SHIPPED
    from rpeg.perf.validation.solve import solve_row

    case = read_case(_aligner(model="Llama-3.1-70B", num_gpus="24", gpu="A100-40GB"))
    assert case.critic_gpus == 8
    priced, lay, pred = solve_row(case, SHIPPED)
    assert priced.critic_gpus == 0 and "critic_gpus" not in priced.unknown
    assert pred.step_s > 0


def test_a_learned_reward_model_keeps_its_weights_beside_the_critic_it_shares_a_pool_with():
    # the critic's own pool holds the critic's update and the reward model, none offloaded:
    # the pool's peak is the critic's working set plus the reward model's weights
    from rpeg.perf import predict
    from rpeg.perf.calibration import SHIPPED

    case = read_case(_aligner(model="Llama-3.1-8B", num_gpus="24", train_tp="8", gen_tp="8"))
    assert case.critic_gpus == 8 and case.reward_model
    from rpeg.perf.validation.solve import solve_layout

    lay, _ = solve_layout(case, SHIPPED)
    pred = predict(case.graph, case.plan(lay), case.workload, calib=SHIPPED)
    crit, rm = pred.stages["train_critic"], pred.stages["reward"]
    peak = pred.device_memory_gb["16-23"]
    assert peak == pytest.approx(crit.peak_memory_gb + rm.memory_gb["weights"], rel=1e-6)


def _fully_async(**cells):
    return _row(
        **{
            "source": "verl fully_async_policy doc",
            "placement": "disaggregated",
            "gen_gpus": "8",
            "train_gpus": "8",
            "staleness": "0",
            "notes": "fully-async: trainer fetches require_batches x ppo_mini_batch_size "
            "prompts per local update",
            **cells,
        }
    )


def test_verls_fully_async_trainer_reuses_rollout_logprobs_and_streams_where_a_row_is_silent():
    # verl fully_async_ppo_trainer.yaml: use_rollout_log_probs True; its trainer fetches each
    # local update's samples from the message queue (trains while the step's rest generate)
    case = read_case(_fully_async())
    assert case.reuse and case.streaming
    assert {"reuse_rollout_logprobs", "streaming"} <= set(case.unknown)  # assumed, not read
    said = assumed_values(case)
    assert "reuse_rollout_logprobs=yes" in said and "streaming=yes" in said

    # priced: no old-policy forward, and training overlaps the generation
    def step(**cells):
        return loso.price_rows([_fully_async(**cells)], "mine")[0][0].step[0, 3, 3]

    assert step() < step(streaming="no", reuse_rollout_logprobs="no")
    # stated cells win; a colocated baseline of the same doc runs verl's ordinary trainer;
    # another family's "fully asynchronous" words are not verl's trainer
    stated = read_case(_fully_async(streaming="no", reuse_rollout_logprobs="no"))
    assert not stated.reuse and not stated.streaming
    colo = read_case(_fully_async(placement="colocated", gen_gpus="", train_gpus=""))
    assert not colo.reuse and not colo.streaming
    other = read_case(_fully_async(source="AReaL paper", train_backend="megatron"))
    assert other.system != "verl-fsdp" and not other.reuse
    # at a staleness above 0 the trainer still reuses the rollout's log-probs
    assert read_case(_fully_async(staleness="1")).reuse
