"""RLHF-style PPO rows (issue 43 item 2): a learned reward model read from a row's text or
taken from its system's default (DeepSpeed-Chat, OpenRLHF), DeepSpeed-Chat's static-batch
generation as its default, and the Llama-2 / CodeLlama architectures of their published
benchmarks priced rather than refused as unknown models."""

import pytest

from rpeg import specs
from rpeg.perf.pricing import predict
from rpeg.perf.validation import loso
from rpeg.perf.validation.row_cells import resolve_model
from rpeg.perf.validation.row_text import read
from rpeg.perf.validation.rows import assumed_values, read_case, row_case
from tests.perf.schema_rows import schema_row


def _row(**cells):
    return schema_row(dict(
        case_id="syn", source="synthetic", measured_step_s="100", gpus_per_node="8",
        model="meta-llama/Llama-2-7b-hf", gpu="A800", num_gpus="16", placement="colocated",
        algorithm="ppo", has_critic="yes", has_ref="yes", num_prompts="256",
        samples_per_prompt="1", max_gen_len="512", avg_gen_len="400", avg_prompt_len="256",
        train_backend="deepspeed", train_minibatches="1",
    ), **cells)  # fmt: skip


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("PPO against a 7B reward model", "yes"),
        ("--reward_pretrain OpenRLHF/Llama-3-8b-rm-mixture", "yes"),
        ("no reward model: rule-based reward on GSM8K", "no"),
        ("GRPO with verifiable rewards", "no"),
        ("reward_model.reward_manager=naive", None),  # verl's config key names no model
        ("a reward model and a reward function", None),  # they disagree: left blank
    ],
)
def test_the_reward_is_read_where_the_text_is_unambiguous(text, value):
    assert read({"notes": text}).get("reward_model") == value


def _pred(r):
    graph, plan, wl = row_case(r)
    return predict(graph, plan, wl), graph


def _step(r):
    pred, graph = _pred(r)
    return pred.step_s, graph


def _reward_s(pred):
    return sum(s.time_s for s in pred.stages.values() if "reward" in s.kinds)


def test_a_reward_model_adds_its_forward_over_every_sample():
    (with_rm, g1), (without, g0) = (
        _pred(_row(notes="PPO with a reward model")),
        _pred(_row(notes="rule-based reward")),
    )
    assert "reward_model" in {s.role.value for s in g1.stages if s.role is not None}
    assert "reward_model" not in {s.role.value for s in g0.stages if s.role is not None}
    # a forward of a 7B model over 256 x 656 tokens on 16 A800 (312 TFLOP/s bf16 each):
    # ~2.26 PFLOP, at least 0.45 s; the rule reward is 2 ms of host work per sample
    flops = 2 * specs.model("llama2-7b").params * 256 * 656
    assert _reward_s(with_rm) > flops / (16 * 312e12)
    assert _reward_s(without) == pytest.approx(256 * 0.002, rel=0.05)
    assert with_rm.step_s > without.step_s


def test_the_rlhf_systems_default_to_a_reward_model_for_ppo_only():
    for source, expected in (
        ("DeepSpeed-Chat benchmark", True),
        ("OpenRLHF paper", True),
        ("verl docs", False),
    ):
        case = read_case(_row(source=source))
        assert case.reward_model is expected, source
        assert ("reward_model" in case.unknown) is expected
    # GRPO (no critic) in OpenRLHF: a rule reward unless the row says
    assert not read_case(_row(source="OpenRLHF paper", has_critic="no")).reward_model
    # a row that says so is taken at its word
    assert not read_case(_row(source="OpenRLHF paper", notes="rule-based reward")).reward_model


def test_deepspeed_chat_generates_in_static_batches_unless_the_row_says():
    ds = read_case(_row(source="DeepSpeed-Chat benchmark"))
    assert ds.workload.gen_static_batch == 16 and "gen_batch_size" in ds.unknown
    assert "gen_batch_size=16 (static batches)" in assumed_values(ds)
    stated = read_case(_row(source="DeepSpeed-Chat benchmark", gen_batching="continuous"))
    assert stated.workload.gen_static_batch is None
    other = read_case(_row(source="OpenRLHF paper"))
    assert other.workload.gen_static_batch is None
    # a static batch decodes each batch to its longest response: slower than continuous
    slow, _ = _step(_row(source="DeepSpeed-Chat benchmark"))
    fast, _ = _step(_row(source="DeepSpeed-Chat benchmark", gen_batching="continuous"))
    assert slow > fast


@pytest.mark.parametrize(
    ("written", "catalog", "kind"),
    [
        ("meta-llama/Llama-2-7b-hf", "llama2-7b", None),
        ("meta-llama/Llama-2-13b-chat-hf", "llama2-13b", "instruct"),
        ("Llama-2-70b-chat-hf", "llama2-70b", "instruct"),
        ("codellama/CodeLlama-34b-Instruct-hf", "codellama-34b", "instruct"),
        ("OpenRLHF/Llama-2-7b-sft-model-ocra-500k", "llama2-7b", None),
        ("nvidia/Nemotron-4-340B-Instruct", "nemotron-4-340b", "instruct"),
    ],
)
def test_llama2_checkpoints_resolve(written, catalog, kind):
    assert resolve_model(written) == (catalog, kind)


def test_llama2_shapes():
    # Llama-2: MHA at 7B/13B (kv heads = heads), GQA 8 at 70B; 32k vocabulary; 4K context
    for name, kv, params_b in (
        ("llama2-7b", 32, 6.74),
        ("llama2-13b", 40, 13.0),
        ("llama2-70b", 8, 69.0),
        ("codellama-34b", 8, 33.7),
    ):
        m = specs.model(name)
        assert m.kv_heads == kv and m.vocab == 32000
        assert m.params / 1e9 == pytest.approx(params_b, rel=0.01)
    assert specs.model("llama2-7b").kv_bytes_per_token(2) == 2 * 32 * 4096 * 2
    # Nemotron-4-340B: squared-ReLU MLP of 2 x 18432 x 73728 per layer, entered as a SwiGLU
    # of 2/3 the width; GQA 8 x 192
    m = specs.model("nemotron-4-340b")
    assert 3 * m.hidden * m.ffn_hidden == 2 * 18432 * 73728
    assert m.kv_bytes_per_token(2) == 96 * 2 * 8 * 192 * 2


@pytest.mark.parametrize(
    ("model", "gpus", "source", "placement"),
    [
        ("meta-llama/Llama-2-70b-hf", 32, "OpenRLHF paper", "disaggregated"),
        ("codellama/CodeLlama-34b-Instruct-hf", 32, "OpenRLHF paper", "disaggregated"),
        ("meta-llama/Llama-2-70b-hf", 32, "DeepSpeed-Chat benchmark", "colocated"),
        ("meta-llama/Llama-2-13b-hf", 32, "DeepSpeed-Chat benchmark", "colocated"),
        ("nvidia/Nemotron-4-340B-Instruct", 256, "NeMo-Aligner paper", "disaggregated"),
    ],
)
def test_published_rlhf_configurations_are_priced_not_refused(model, gpus, source, placement):
    r = _row(
        model=model, num_gpus=gpus, source=source, placement=placement, num_prompts=1024,
        max_gen_len=1024, avg_gen_len="", avg_prompt_len=1024,
    )  # fmt: skip
    priced, refused = loso.price_rows([r], "synthetic")
    assert [x.reason for x in refused] == [] and len(priced) == 1
    assert priced[0].step.min() > 0


def test_a_reward_model_runs_on_the_trainer_pool_with_the_reference():
    # a disaggregated OpenRLHF-style row: the rollout engine on 8 GPUs, the ZeRO models
    # (reference, critic, reward model) on the other 8
    r = _row(
        source="OpenRLHF paper", placement="disaggregated", gen_gpus=8, train_gpus=8, gen_tp=1,
        train_tp=1,
    )  # fmt: skip
    graph, plan, wl = row_case(r)
    where = {name: u.devices for name, u in plan.units.items()}
    reward = next(n for n in where if "reward" in n)
    ref = next(n for n in where if "ref" in n)
    gen = next(n for n in where if "generate" in n)
    assert where[reward] == where[ref] != where[gen]
    # a rule reward stays with the rollout (host scoring of its samples)
    graph, plan, wl = row_case({**r, "notes": "rule-based reward"})
    where = {name: u.devices for name, u in plan.units.items()}
    assert where[next(n for n in where if "reward" in n)] == where[gen]


def _forward_flops(r):
    pred, _ = _pred(r)
    return next(s.flops for s in pred.stages.values() if "ref_logprob" in s.kinds)


def test_deepspeed_chat_computes_every_prompt_padded_to_its_budget():
    # DeepSpeed-Chat's collator pads each prompt to max_prompt_seq_len = max_seq_len -
    # max_gen_len (here 1024 - 512 = 512 tokens) whatever the prompts' own length (256)
    r = _row(source="DeepSpeed-Chat benchmark", max_seq_len="1024")
    ds = read_case(r)
    assert ds.workload.mean_prompt_tokens == 512
    assert any("prompts padded to the 512-token prompt budget" in a for a in ds.workload.assumed)
    # with no packing: fixed [batch, seq] tensors (a blank seq_packing, listed as assumed)
    assert ds.packing is False and "seq_packing=no" in assumed_values(ds)
    # shown beside the priors (the padded length is known, so it widens no range)
    assert "avg_prompt_len=512 (padded to the prompt budget)" in assumed_values(ds)
    assert "avg_prompt_len" not in ds.unknown
    # another system computes the prompts as published, and packs by default
    other = read_case(_row(source="OpenRLHF paper", max_seq_len="1024"))
    assert other.workload.mean_prompt_tokens == 256 and other.packing is True
    # without a stated budget nothing says how far prompts were padded: the published length
    assert read_case(_row(source="DeepSpeed-Chat benchmark")).workload.mean_prompt_tokens == 256
    # the passes see the padding: a forward's FLOPs grow with (512 + 400) / (256 + 400) tokens
    # per sample at least (attention grows faster)
    padded = _forward_flops(r)
    stated = _forward_flops({**r, "seq_packing": "no", "source": "OpenRLHF paper"})
    assert padded / stated >= (512 + 400) / (256 + 400) - 1e-9
    # a stated seq_packing is kept
    assert read_case({**r, "seq_packing": "yes"}).packing is True


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("Optimized DeepSpeed-Chat with Hybrid Engine, Adam offload", "yes"),
        ("--adam_offload --flash_attn", "yes"),
        ("zero_optimization.offload_optimizer.device=cpu", "yes"),
        ("ZeRO-Offload (CPU Adam)", "yes"),
        ("adam_offload: false", "no"),
        # verl's optimizer_offload keeps the state on the host between phases; the step runs
        # on the GPU
        ("actor_rollout_ref.actor.fsdp_config.optimizer_offload=True", None),
    ],
)
def test_an_optimizer_on_the_host_is_read_where_the_text_says_it(text, value):
    assert read({"notes": text}).get("cpu_adam") == value


def test_a_stated_cpu_adam_prices_the_host_step_and_frees_the_device():
    on_gpu = read_case(_row(source="OpenRLHF paper"))
    on_host = read_case(_row(source="OpenRLHF paper", cpu_adam="yes"))
    assert not on_gpu.workload.assumed_optimizer_on_host
    assert on_host.workload.assumed_optimizer_on_host
    p_gpu, _ = _pred(_row(source="OpenRLHF paper"))
    p_host, _ = _pred(_row(source="OpenRLHF paper", cpu_adam="yes"))
    train = next(n for n, s in p_gpu.stages.items() if "train_actor" in s.kinds)
    # the optimizer state leaves the device; its step crosses the host link and runs a CPU Adam
    assert p_host.stages[train].memory_gb["optimizer"] == 0.0
    assert p_gpu.stages[train].memory_gb["optimizer"] > 0.0
    assert p_host.stages[train].detail["optimizer_s"] > p_gpu.stages[train].detail["optimizer_s"]
    # stated, it is the row's own setting: not a fit measure the solve assumed
    priced, refused = loso.price_rows([_row(source="OpenRLHF paper", cpu_adam="yes")], "syn")
    assert not refused and "optimizer" not in priced[0].solved
    assert "optimizer on the host" in priced[0].mechanisms
