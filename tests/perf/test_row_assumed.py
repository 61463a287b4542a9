"""A row that leaves optional columns blank is predicted with each prior's value listed
(issue 30 item 4, rpeg.perf.validation.rows.assumed_values); only an unknown model whose name
states no size, or an unknown GPU, is refused, naming how to add it."""

import csv
import math
from statistics import NormalDist

import pytest

from rpeg.perf.validation import loso
from rpeg.perf.validation.rows import assumed_values, read_case

BLANK = {
    "case_id": "blank-1",
    "source": "user",
    "algorithm": "grpo",
    "model": "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
    "gpu": "H100",
    "num_gpus": "16",
    "gpus_per_node": "8",
    "num_prompts": "32",
    "samples_per_prompt": "8",
    "measured_step_s": "300",
}


def test_every_prior_a_blank_row_takes_is_listed_with_its_value():
    case = read_case({**BLANK, "algorithm": ""})
    got = dict(a.split("=", 1) for a in assumed_values(case))
    # a reasoning model with neither max_gen_len nor max_seq_len: the recipes' 32,768 budget;
    # its mean: lognormal median 4,762 x (32768/4096)^0.483 = 13,005 at that budget, sigma 1,
    # truncated at 32,768: m e^0.5 Phi(ln(32768/m) - 1) + 32768 (1 - Phi(ln(32768/m)))
    m = 4762 * 8**0.483
    phi = NormalDist().cdf
    mean = m * math.exp(0.5) * phi(math.log(32768 / m) - 1) + 32768 * (1 - phi(math.log(32768 / m)))
    assert 15_880 < mean < 15_900  # worked by hand: 10,071 + 5,823
    assert got["max_gen_len"] == "32768"
    assert got["avg_gen_len"] == f"{mean:.0f} (reasoning prior)"
    assert got["avg_prompt_len"] == "150"
    assert got["precision"] == "bf16"
    assert got["train_minibatches"] == "1"  # a blank was taken as 1 without saying so
    assert got["placement"] == "colocated"
    assert got["act_ckpt"] == "yes" and got["seq_packing"] == "yes"
    assert "gpu_memory_utilization" not in got  # solved with the layout, listed apart
    # the run's shape: on-policy, no partial rollout, no reference model, GRPO
    assert (got["staleness"], got["partial_rollout"], got["has_ref"]) == ("0", "no", "no")
    assert got["algorithm"] == "grpo"


def test_a_blank_staleness_with_partial_rollout_is_one_step():
    case = read_case({**BLANK, "partial_rollout": "yes", "algorithm": "ppo"})
    got = dict(a.split("=", 1) for a in assumed_values(case))
    assert got["staleness"] == "1" and "partial_rollout" not in got and "algorithm" not in got


def test_a_row_publishing_a_column_does_not_list_it():
    case = read_case({**BLANK, "max_gen_len": "4096", "train_minibatches": "4"})
    names = {a.split("=", 1)[0] for a in assumed_values(case)}
    assert "max_gen_len" not in names and "train_minibatches" not in names
    assert "avg_gen_len" in names


@pytest.mark.parametrize(
    ("cell", "value", "says"),
    [
        # a name stating no size: nothing to stand in for it (rpeg.perf.validation.row_cells)
        ("model", "acme-lm", "unknown model 'acme-lm' (add it: rpeg specs add-model --from-hf"),
        ("gpu", "H300", "unknown GPU 'H300' (add it to the user gpus.yaml; catalog: a10, a100-40g"),
        ("model", "", "model not published (a catalog name: `rpeg specs list`)"),
    ],
)
def test_only_an_unknown_model_or_gpu_is_refused_naming_how_to_add_it(cell, value, says):
    priced, (refused,) = loso.price_rows([{**BLANK, cell: value}], "mine")
    assert not priced
    assert refused.reason.startswith(says)


def test_validate_prints_the_assumed_values(tmp_path):
    path = tmp_path / "mine.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(BLANK) + ["system"])
        w.writeheader()
        w.writerow({**BLANK, "model": "qwen3.5-9b", "system": "my-own-stack"})
    priced, refused = loso.price_rows(list(csv.DictReader(path.open())), "mine")
    assert not refused
    (p,) = priced
    assert "image_tokens=0" in p.assumed  # Qwen3.5 is multimodal; text RL: no images
    assert "max_gen_len=32768" in p.assumed


def test_a_node_size_the_catalog_lacks_is_derived_and_listed_not_refused():
    """H100 nodes of 4 GPUs (no such catalog cluster): priced on dgx-h100's links with 4 GPUs
    a node, listed as assumed; a gen TP of 8 then crosses the node (NICs, not NVLink), so the
    same run costs more than on 8-GPU nodes."""
    from rpeg import specs
    from rpeg.perf.calibration import SHIPPED
    from rpeg.perf.pricing import predict
    from rpeg.perf.validation.solve import solve_layout

    # Llama-3.1-8B: 32 attention heads, so TP 8 is a split vLLM runs (the 7B's 28 are not)
    row = {**BLANK, "model": "llama3.1-8b", "gen_tp": "8", "train_tp": "1", "max_gen_len": "4096"}
    priced, refused = loso.price_rows([{**row, "gpus_per_node": "4"}], "mine")
    assert not refused
    assert "cluster=dgx-h100-4-per-node" in priced[0].assumed
    cl = specs.cluster("dgx-h100-4-per-node")
    base = specs.cluster("dgx-h100")
    assert (cl.gpus_per_node, cl.domain_size, cl.nics_per_node) == (4, 4, base.nics_per_node // 2)
    assert cl.gpu == base.gpu and cl.gbps_per_nic == base.gbps_per_nic

    def step(gpn):
        case = read_case({**row, "gpus_per_node": gpn})
        lay, _ = solve_layout(case, SHIPPED)
        return predict(case.graph, case.plan(lay), case.workload, calib=SHIPPED).step_s

    assert step("4") > step("8")
    for bad in ("0", "-4", "1.5"):
        priced, (refused,) = loso.price_rows([{**row, "gpus_per_node": bad}], "mine")
        assert refused.reason.startswith(f"gpus_per_node={bad}: must be a whole number >= 1")


@pytest.mark.parametrize(
    ("written", "catalog"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("A100-SXM4-80GB", "a100-80g"),
        ("A100-PCIe-80GB", "a100-pcie"),
        ("A100 40GB", "a100-40g"),
        ("AMD Instinct MI300X", "mi300x"),
        ("GH200 144GB HBM3e", "gh200-144g"),
        ("H100 NVL", "h100-nvl"),
        # a bracketed memory size or a count before the name is not the GPU's name
        ("H100 (80GB)", "h100-sxm"),
        ("8xH100", "h100-sxm"),
        ("8 x A100 40GB", "a100-40g"),
        ("16\u00d7H800", "h800"),
        ("H300", "h300"),  # no such GPU: kept as written, refused by unknown_names
    ],
)
def test_marketing_gpu_names_reach_the_catalog(written, catalog):
    from rpeg.perf.validation.row_cells import gpu_name

    assert gpu_name({"gpu": written}) == catalog


@pytest.mark.parametrize(
    ("written", "catalog", "kind"),
    [
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b-instruct", None),
        ("Qwen/Qwen3-4B-Instruct-2507", "qwen3-4b", "instruct"),
        ("Qwen3-30B-A3B-Base", "qwen3-30b-a3b", "base"),
    ],
)
def test_version_and_date_suffixes_reach_the_catalog(written, catalog, kind):
    from rpeg.perf.validation.row_cells import resolve_model

    assert resolve_model(written) == (catalog, kind)


@pytest.mark.parametrize(
    ("cell", "value", "says"),
    [
        ("measured_step_s", "0", "unreadable: measured_step_s=0: must be a positive number"),
        ("measured_step_s", "-1", "unreadable: measured_step_s=-1: must be a positive number"),
        ("num_gpus", "yes", "unreadable: num_gpus='yes' is not a number"),
        ("measured_train_s", "abc", "measured_train_s='abc' is not a number"),
    ],
)
def test_a_bad_measured_cell_refuses_its_row_not_the_check(cell, value, says, tmp_path):
    """One unreadable or impossible cell refuses that row, naming it; the other rows are
    still scored (a step of 0 s used to end `rpeg validate` with a math domain error)."""
    shipped = list(csv.DictReader(loso.default_datasets()["steps_dev"].open()))
    good = [r for r in shipped if r["source"].startswith("NeMo-RL")][:4]
    good[2]["source"] = good[3]["source"] = "another report"  # two sources: a LOSO fold each
    bad = {**good[0], "case_id": "bad-1", cell: value}
    path = tmp_path / "mine.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(shipped[0]))
        w.writeheader()
        w.writerows([*good, bad])
    scored, refused = loso.run({"mine": path})
    (why,) = [s.reason for s in refused if s.case_id == "bad-1"]
    assert says in why
    assert {s.case_id for s in scored if s.pred_loso} == {r["case_id"] for r in good}
