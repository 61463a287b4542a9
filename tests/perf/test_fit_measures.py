"""A run that happened is never refused for memory while a measure its system would have
taken remains (rpeg.perf.validation.solve.solve_row): the trainer's optimizer on the host, a
pipeline, a context-parallel split, the trainer pool's idle models on the host."""

from dataclasses import replace

import pytest

from rpeg.perf.calibration import SHIPPED
from rpeg.perf.pricing import predict
from rpeg.perf.validation import loso
from rpeg.perf.validation.published import read_rows
from rpeg.perf.validation.rows import read_case
from rpeg.perf.validation.solve import solve_layout, solve_row
from rpeg.plan.schema import InfeasiblePlan


def _row(case_id):
    for path in loso.default_datasets().values():
        for r in read_rows(path):
            if r["case_id"] == case_id:
                return r
    raise KeyError(case_id)


def test_a_published_run_no_layout_fits_is_priced_with_the_optimizer_on_the_host():
    # verl's DeepSeek-671B on 96 H20: Megatron TP8 x PP12 leaves no data parallelism to
    # shard the optimizer over (its script offloads it to the CPU; the row does not say)
    case = read_case(_row("verl-dpsk671b-96g"))
    with pytest.raises(InfeasiblePlan) as exc:
        solve_layout(case, SHIPPED)
    assert exc.value.reason == "memory"
    priced, lay, pred = solve_row(case, SHIPPED)
    assert lay.solved["optimizer"] == "host"
    assert priced.workload.assumed_optimizer_on_host
    train = pred.stages["train_actor"]
    assert train.memory_gb["optimizer"] == 0.0
    assert max(s.peak_memory_gb for s in pred.stages.values()) <= 96.0
    assert any("optimizer assumed on the host" in a for a in pred.assumptions)
    # the host step costs time: the same plan with the optimizer on the device (memory
    # unchecked) trains faster
    on_device = predict(
        case.graph, case.plan(lay), case.workload, calib=SHIPPED, check_memory=False
    )
    assert train.time_s > on_device.stages["train_actor"].time_s


def test_a_run_that_fits_is_priced_as_described():
    case = read_case(_row("nemo-v0.5-h100bf16-llama-grpo-on-16g"))
    priced, lay, pred = solve_row(case, SHIPPED)
    assert priced is case and "optimizer" not in lay.solved
    assert pred.step_s == pytest.approx(solve_layout(case, SHIPPED)[1].step_s)
    assert pred.stages["train_actor"].memory_gb["optimizer"] > 0


def test_the_host_optimizer_time_grows_with_the_updates_per_step():
    case = read_case(_row("verl-dpsk671b-96g"))
    priced, lay, _ = solve_row(case, SHIPPED)
    plan = case.plan(lay)
    times = [
        predict(
            priced.graph,
            plan,
            replace(priced.workload, train_minibatches=k),
            calib=SHIPPED,
        )
        .stages["train_actor"]
        .detail["optimizer_s"]
        for k in (1, 2)
    ]
    assert times[1] == pytest.approx(2 * times[0]) and times[0] > 1.0


def _described(**cells):
    """A run described in the shared schema only (blank cells unknown)."""
    path = loso.shared_copies()["steps_dev (shared schema)"]
    with open(path) as fh:
        header = fh.readline().strip().split(",")
    return {**{k: "" for k in header}, **{k: str(v) for k, v in cells.items()}}


def test_a_trainer_with_no_stated_pipeline_takes_the_fewest_stages_that_fit():
    # DeepSeek-V3 GRPO on 64 H800 with a Megatron trainer and no layout stated:
    # weights + gradients alone are 2.7 TB, 42 GB a GPU only when split 64 ways. A Megatron
    # recipe spreads such a model over pipeline stages before it offloads its optimizer
    row = _described(
        case_id="dsv3-64",
        source="a report",
        model="deepseek-v3",
        gpu="h800",
        num_gpus=64,
        gpus_per_node=8,
        placement="colocated",
        train_backend="megatron",
        num_prompts=64,
        samples_per_prompt=8,
        avg_prompt_len=256,
        avg_gen_len=1024,
        max_gen_len=2048,
        measured_step_s=300,
    )
    case = read_case(row)
    assert case.pp_open
    with pytest.raises(InfeasiblePlan):
        solve_layout(case, SHIPPED)
    priced, lay, pred = solve_row(case, SHIPPED)
    assert "optimizer" not in lay.solved and lay.solved["train_pp"] >= 2
    assert not priced.workload.assumed_optimizer_on_host
    assert pred.stages["train_actor"].memory_gb["optimizer"] > 0
    assert max(s.peak_memory_gb for s in pred.stages.values()) <= 80.0
    assert any(f"{lay.train_pp} pipeline stages" in a for a in pred.assumptions)
    # fewer stages do not fit
    fewer = replace(priced, layout=replace(priced.layout, train_pp=lay.train_pp // 2))
    with pytest.raises(InfeasiblePlan):
        solve_layout(fewer, SHIPPED)
    # a row that states its pipeline keeps it: nothing is assumed against a stated cell
    stated = read_case({**row, "train_pp": "1"})
    assert not stated.pp_open
    with pytest.raises(InfeasiblePlan):
        solve_row(stated, SHIPPED)


def test_a_pool_no_power_of_two_divides_takes_stages_that_divide_the_layers():
    # Llama-3.1-405B (126 layers) on 1,008 H100 (NeMo-Aligner's 84 + 42 nodes): 1,008 = 16 x 63,
    # so no power-of-two stage count over TP8 divides it, but 7, 9, 14, ... stages do (each
    # divides the 126 layers): the run is priced, never refused for memory
    from rpeg.perf.validation.solve import fit_pp

    assert fit_pp(1008, 126)[:4] == [2, 3, 4, 6]
    assert 5 not in fit_pp(1000, 126)  # divides the pool, not the layers: not a power of two
    assert all(1008 % p == 0 for p in fit_pp(1008, 126))
    row = _described(
        case_id="l405-1008",
        source="a report",
        model="llama3.1-405b",
        gpu="h100",
        num_gpus=1008,
        gpus_per_node=8,
        placement="colocated",
        train_backend="megatron",
        algorithm="ppo",
        num_prompts=128,
        samples_per_prompt=1,
        avg_gen_len=916,
        measured_step_s=165,
    )
    case = read_case(row)
    priced, lay, pred = solve_row(case, SHIPPED)
    pp = lay.train_pp
    assert pp > 1 and 1008 % (lay.train_tp * pp) == 0 and 126 % pp == 0
    assert max(s.peak_memory_gb for s in pred.stages.values()) <= 80.0
    assert any(f"{pp} pipeline stages" in a for a in pred.assumptions)


def test_a_trainer_with_no_stated_context_parallel_splits_a_long_sequence_to_fit():
    # Qwen3-8B trained on 64k-token sequences on 16 A100-40GB, FSDP, nothing else stated:
    # one sequence's activations and logits exceed a GPU even with the optimizer on the host
    row = _described(
        case_id="long-cp",
        source="a report",
        model="qwen3-8b",
        gpu="a100-40g",
        num_gpus=16,
        gpus_per_node=8,
        placement="colocated",
        train_backend="fsdp",
        num_prompts=16,
        samples_per_prompt=8,
        avg_prompt_len=256,
        avg_gen_len=32768,
        max_gen_len=65536,
        measured_step_s=300,
    )
    case = read_case(row)
    assert case.cp_open
    host = replace(case, workload=replace(case.workload, assumed_optimizer_on_host=True))
    with pytest.raises(InfeasiblePlan):
        solve_layout(host, SHIPPED)
    priced, lay, pred = solve_row(case, SHIPPED)
    assert lay.solved["optimizer"] == "host" and lay.solved["train_cp"] >= 2
    assert lay.train_cp == lay.solved["train_cp"]
    assert max(s.peak_memory_gb for s in pred.stages.values()) <= 40.0
    assert any("context-parallel" in a for a in pred.assumptions)
    # fewer ranks per sequence do not fit
    if lay.train_cp > 2:
        fewer = replace(priced, layout=replace(priced.layout, train_cp=lay.train_cp // 2))
        with pytest.raises(InfeasiblePlan):
            solve_layout(fewer, SHIPPED)
    # a stated context-parallel size is kept
    stated = read_case({**row, "train_cp": "1"})
    assert not stated.cp_open
    with pytest.raises(InfeasiblePlan):
        solve_row(stated, SHIPPED)


def test_a_row_that_fits_at_its_lengths_is_priced_though_twice_them_would_not():
    # loso prices an unpublished-length row at multipliers of the prior's length (0.5-2x)
    # on the layout solved at the prior; a multiplier's memory is not the run's
    from rpeg.perf.validation.loso_lengths import LEN_GRID, scaled

    row = _described(
        case_id="7b-32k",
        source="a report",
        model="qwen2.5-7b",
        gpu="a100-40g",
        num_gpus=256,
        gpus_per_node=8,
        placement="colocated",
        algorithm="grpo",
        num_prompts=128,
        samples_per_prompt=4,
        max_gen_len=32768,
        measured_step_s=300,
    )
    priced_case, lay, _ = solve_row(read_case(row), SHIPPED)
    plan = priced_case.plan(lay)
    with pytest.raises(InfeasiblePlan):  # the path under test: 2x the prior does not fit
        predict(priced_case.graph, plan, priced_case.workload, calib=scaled(SHIPPED, LEN_GRID[-1]))
    priced, refused = loso.price_rows([row], "mine")
    assert not refused and len(priced) == 1


def _llama_405b():
    """Llama-3.1-405B GRPO on 64 H100 (8 per node), Megatron, no layout stated."""
    return _described(
        case_id="405b-64",
        source="a report",
        model="llama-3.1-405b",
        gpu="h100",
        num_gpus=64,
        gpus_per_node=8,
        placement="colocated",
        train_backend="megatron",
        num_prompts=64,
        samples_per_prompt=16,
        max_gen_len=8192,
        measured_step_s=300,
    )


def test_a_megatron_trainer_keeps_its_tensor_parallel_group_inside_a_node():
    # the training TP stays within a node's NVLink and the model spreads over pipeline stages across
    # nodes (was: TP 64, every layer's all-reduces over the network)
    priced, lay, pred = solve_row(read_case(_llama_405b()), SHIPPED)
    assert lay.train_tp <= 8 and lay.train_pp >= 2
    assert lay.solved["train_pp"] == lay.train_pp
    assert max(s.peak_memory_gb for s in pred.stages.values()) <= 80.0
    # the engine needs more than one node for 810 GB of bf16 weights: TP across nodes, or
    # (vLLM's multi-node layout) TP in the node times pipeline stages across nodes
    assert lay.gen_tp * lay.gen_pp * 80 >= 810
    assert lay.gen_tp <= 8 or lay.gen_pp == 1


def test_an_engine_too_large_for_a_node_may_pipeline_across_nodes():
    # the same 405B rows' engine: TP 8 x PP 2 is among the candidates (a row that states
    # gen_pp keeps it), a model a node holds is never pipelined
    from rpeg.perf.validation.solve import _gen_candidates

    row = _llama_405b()
    case = read_case(row)
    assert case.gen_pp_open
    gens = _gen_candidates(case, 64, 8)
    assert (8, 2) in gens and (16, 1) in gens and all(t <= 8 for t, p in gens if p > 1)
    stated = read_case({**row, "gen_pp": "1"})
    assert _gen_candidates(stated, 64, 8) == [g for g in gens if g[1] == 1]
    small = read_case({**row, "model": "llama3.1-70b"})  # 141 GB: one node's 8 x 80 GB
    assert all(p == 1 for _, p in _gen_candidates(small, 64, 8))


def _ppo_on_a10g(gpu: str) -> dict[str, str]:
    # an OpenRLHF PPO of a 9B model (actor, critic, reference, reward model) on 8 GPUs split
    # 4 + 4: on 24 GB parts the trainer pool holds four models' shards
    return _described(
        case_id=f"ppo-9b-{gpu}",
        source="OpenRLHF report",
        model="gemma-2-9b",
        gpu=gpu,
        num_gpus=8,
        gpus_per_node=8,
        placement="disaggregated",
        gen_gpus=4,
        train_gpus=4,
        algorithm="ppo",
        has_critic="yes",
        train_backend="deepspeed",
        num_prompts=512,
        samples_per_prompt=1,
        max_gen_len=4096,
        measured_step_s=100,
    )


def test_a_trainer_pool_of_several_models_keeps_the_idle_ones_on_the_host():
    case = read_case(_ppo_on_a10g("a10g"))
    priced, lay, pred = solve_row(case, SHIPPED)
    assert lay.solved["idle_models"] == "host" and lay.solved["optimizer"] == "host"
    assert priced.idle_offload and not case.idle_offload
    assert any("--ref_reward_offload" in a for a in pred.assumptions)
    assert max(pred.device_memory_gb.values()) <= 24.0
    # the moves cost time: an offload/reload record on the step's timeline
    assert any(r.kind == "offload" for r in pred.timeline)
    # where the pool holds them all (with the optimizer on the host), they stay on the device
    roomy = solve_row(read_case(_ppo_on_a10g("a100-80g")), SHIPPED)[1]
    assert "idle_models" not in roomy.solved
