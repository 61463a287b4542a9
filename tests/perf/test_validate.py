"""The model against the published runs that ship with rpeg, and the validate/predict/specs
commands. Nothing here reads ../shared: the data set is package data."""

import json
import math
import random
from pathlib import Path

import pytest

from rpeg.cli import main
from rpeg.perf.validation.published import read_rows, validate_csv, validate_rows

REPO = Path(__file__).resolve().parents[2]
ROWS = read_rows()


@pytest.fixture(scope="module")
def report():
    return validate_csv()


def _row(case_id):
    return dict(next(r for r in ROWS if r["case_id"] == case_id))


def test_shipped_data_set_is_complete():
    assert len(ROWS) >= 60
    fams = {r["source"].split()[0] for r in ROWS}
    assert {"NeMo-RL", "AReaL"} <= fams and any("verl" in f for f in fams)
    for r in ROWS:  # every row names where its numbers come from
        assert r["source_locator"].strip(), r["case_id"]


def test_dev_set_targets_on_every_row(report):
    # No exclusions. Figures measured with `rpeg validate` are in docs/perf-model.md.
    assert len(report.compared) >= 50
    assert report.mape <= 12.5
    by = report.by_source()
    assert by["NeMo-RL"][0] <= 12.0 and by["verl"][0] <= 25.0


def test_intervals_cover_the_measurements(report):
    assert report.coverage >= 0.8
    assert report.median_width <= 0.40
    for r in report.compared:
        assert r.predicted_low_s <= r.predicted_step_s <= r.predicted_high_s


def test_interval_widens_when_the_response_length_is_unknown():
    r = _row("nemo-v0.5-h100bf16-llama-grpo-on-16g")
    known, blank = validate_rows([r, dict(r, case_id="blank", avg_gen_len="")]).rows
    assert "avg_gen_len" in blank.unknown and "avg_gen_len" not in known.unknown
    assert blank.width > known.width


def test_stage_errors_where_stages_are_published(report):
    st = report.stage_errors()
    assert {"generate", "train_actor", "old_logprob"} <= set(st)
    # the verl fully-async "gen" column is the trainer's wait, not the rollout: not compared
    wait = next(r for r in report.rows if r.case_id == "verl-fa-7b-async-32-32")
    assert "generate" not in wait.stages and "train_actor" in wait.stages


def test_no_case_id_or_source_name_switches_behaviour_in_the_package():
    ids = {r["case_id"] for r in ROWS}
    for path in (REPO / "rpeg").rglob("*.py"):
        text = path.read_text()
        hit = [c for c in ids if c in text]
        assert not hit, f"{path} names validation rows {hit}"
        assert "typical_response_tokens" not in text, path


def test_blank_generation_tp_is_solved_not_tp1():
    # Qwen3-32B on 64 GPUs, 1-off: published gen TP 4. At TP=1 the model was 8x slow.
    r = _row("nemo-v0.5-h100bf16-q32-grpo-1off-64g")
    pub, blank = validate_rows([r, dict(r, case_id="blank", gen_tp="", train_tp="")]).rows
    assert blank.solved["gen_tp"] > 1 and blank.solved["train_tp"] > 1
    assert abs(blank.predicted_step_s / pub.predicted_step_s - 1) < 0.2
    assert abs(blank.error) < 0.25
    assert any("solved" in a for a in blank.prediction.assumptions)


def test_blank_layout_of_a_70b_model_is_feasible():
    # 141 GB of bf16 weights: no single GPU holds them; the solver spreads them
    r = dict(_row("nemo-v0.5-h100bf16-llama-grpo-on-16g"), model="llama3.1-70b")
    r.update(gen_tp="", train_tp="", train_pp="1", case_id="70b")
    (res,) = validate_rows([r]).rows
    assert res.prediction is not None, res.reason
    assert res.solved["gen_tp"] >= 2 and res.solved["train_tp"] >= 2


def test_length_prior_matches_a_monte_carlo_of_its_definition():
    from rpeg.perf.calibration import SHIPPED
    from rpeg.perf.lengths import prior_mean

    rng = random.Random(0)
    for kind, median in (
        ("reasoning", SHIPPED.response_median_reasoning),
        ("instruct", SHIPPED.response_median_instruct),
    ):
        for cap in (1500, 4096, 16384, 28672):
            # a reasoning model's median grows with its budget: (cap / 4096) ** exponent
            grow = SHIPPED.reasoning_cap_exponent * (kind == "reasoning")
            at = median * (cap / SHIPPED.reasoning_cap_ref) ** grow
            xs = [min(at * math.exp(rng.gauss(0, SHIPPED.length_sigma)), cap) for _ in range(40000)]
            mc = sum(xs) / len(xs)
            assert prior_mean(kind, cap, SHIPPED) == pytest.approx(mc, rel=0.02)


def test_a_reasoning_prior_grows_with_its_budget_and_meets_a_length_it_was_not_set_on():
    from rpeg.perf.calibration import SHIPPED
    from rpeg.perf.lengths import prior_mean

    # set on NeMo-RL's Qwen3 lengths at ~4k and ~8k caps; the Miles blog's Qwen3-30B-A3B run
    # (another source, another system) published a 5,700-token mean at an 8,192 cap
    assert prior_mean("reasoning", 8192, SHIPPED) == pytest.approx(5700, rel=0.05)
    # a thinking trace fills a longer budget; an instruct answer is only truncated by it
    assert prior_mean("reasoning", 32768, SHIPPED) > 2.5 * prior_mean("reasoning", 8192, SHIPPED)
    assert prior_mean("instruct", 32768, SHIPPED) < 1.1 * prior_mean("instruct", 8192, SHIPPED)


def test_unknown_names_are_listed_not_fatal(tmp_path, capsys):
    rows = ROWS[:3]
    bad = [dict(rows[0], model="llama9-max"), dict(rows[1], gpu="tpu-v9"), dict(rows[2])]
    rep = validate_rows(bad)
    a, b, c = rep.rows
    assert a.prediction is None and "llama9-max" in a.reason and "add-model" in a.reason
    assert b.prediction is None and "tpu-v9" in b.reason
    assert c.prediction is not None
    path = tmp_path / "bad.csv"
    import csv

    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(ROWS[0]))
        w.writeheader()
        w.writerows(bad)
    # the file's own sources only (--alone): the shipped sets' fit is the default-table test's
    assert main(["validate", str(path), "--alone"]) == 0
    out = capsys.readouterr().out
    assert "llama9-max" in out and "not predicted" in out and "n=1" in out


def test_cli_validate_default_table_and_json(capsys, monkeypatch):
    from rpeg.perf.validation import loso

    # the table and the JSON of one run: the leave-one-source-out pass (~20 s) runs once
    real, memo = loso.run, {}

    def once(paths, *args, **kwargs):
        key = tuple(sorted((k, str(v)) for k, v in paths.items()))
        if key not in memo:
            memo[key] = real(paths, *args, **kwargs)
        return memo[key]

    monkeypatch.setattr(loso, "run", once)
    assert main(["validate"]) == 0
    out = capsys.readouterr().out
    assert "MAPE=" in out and "coverage=" in out and "median_width=" in out
    assert "stage train_actor" in out and "not predicted" in out
    assert "one-shot   MAPE=" in out  # one row of a source calibrates, the others scored
    assert main(["validate", "--json"]) == 0

    def strict(const):  # NaN / Infinity are not JSON: strict readers refuse the document
        raise ValueError(f"non-JSON number {const}")

    data = json.loads(capsys.readouterr().out, parse_constant=strict)
    # a figure that does not exist is null: a one-row source has no one-shot error
    one_row = data["by_source"]["verl GitHub issue #1208"]
    assert one_row["rows"] == 1 and one_row["mape"] > 0
    assert one_row["one_shot"]["rows"] == 0 and one_row["one_shot"]["mape"] is None
    row = data["rows"][0]
    assert {"predicted_step_s", "predicted_low_s", "predicted_high_s", "measured_step_s"} <= set(
        row
    )
    assert 0.0 <= data["coverage"] <= 1.0 and data["mape"] > 0
    assert "train_actor" in data["stage_errors"]
    # leave-one-source-out is the headline: pooled and per shipped data set
    assert {"mape", "max_ape", "coverage", "predicted_share"} <= set(data["loso"])
    assert set(data["datasets"]) == {"steps_dev", "steps_dev2"}
    for ds in data["datasets"].values():
        assert ds["loso"]["rows"] >= 30 and 0 < ds["loso"]["predicted_share"] <= 1
    assert data["loso"]["predicted_share"] >= 0.95
    assert data["loso"]["coverage"] >= 0.8
    assert data["in_sample"]["rows"] == data["loso"]["rows"]
    # one-shot beside LOSO, pooled and per data set: every source with two step rows
    assert {"mape", "max_ape", "coverage", "rows"} <= set(data["one_shot"])
    assert (
        sum(ds["one_shot"]["rows"] for ds in data["datasets"].values())
        == (data["one_shot"]["rows"])
    )
    assert data["one_shot"]["rows"] >= 80 and 0 < data["one_shot"]["coverage"] <= 1
    assert "NeMo-RL performance summary v0.4" in data["by_source"]
    assert "verl-fsdp" in data["by_system"]


def test_cli_validate_missing_file_exit_2(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.csv")]) == 2
    assert "file not found" in capsys.readouterr().err


def test_cli_validate_a_folder_exit_2(tmp_path, capsys):
    assert main(["validate", str(tmp_path)]) == 2
    assert "is a folder; expected a CSV file" in capsys.readouterr().err


def test_cli_predict_with_gantt(tmp_path, capsys):
    from rpeg.ir import builders
    from rpeg.plan import colocated_plan

    g = builders.build("grpo", use_reference=True)
    plan = colocated_plan(g, "dgx-h100", num_nodes=1, model="llama3.1-8b", builder="grpo")
    (tmp_path / "plan.yaml").write_text(plan.to_yaml())
    (tmp_path / "run.yaml").write_text(
        "workload: {num_prompts: 32, samples_per_prompt: 8, max_prompt_tokens: 256, max_response_tokens: 2048, "
        "mean_response_tokens: 800, precision: bf16}\n"
    )
    svg = tmp_path / "g.svg"
    rc = main(
        [
            "predict",
            str(tmp_path / "plan.yaml"),
            "--config",
            str(tmp_path / "run.yaml"),
            "--gantt",
            str(svg),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "step=" in out and "MFU=" in out and "range" in out and svg.exists()
    assert main(["predict", str(tmp_path / "plan.yaml"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["timeline"][0]["stage"] == "generate"
    assert data["predicted_low_s"] <= data["step_s"] <= data["predicted_high_s"]


def test_cli_specs_lists(capsys):
    assert main(["specs"]) == 0
    out = capsys.readouterr().out
    assert "h100-sxm" in out and "dgx-h100" in out and "deepseek-v3" in out
    assert main(["specs", "list"]) == 0
    assert capsys.readouterr().out == out
    assert "0.00 B" not in out  # small models in units that show them


def test_parameter_counts_print_in_units_that_show_them():
    from rpeg.specs.models import format_params

    assert format_params(350_000) == "350 K"
    assert format_params(7.62e6) == "7.62 M"
    assert format_params(1.544e9) == "1.54 B"
    assert format_params(671e9) == "671 B"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"a,b\n1,2\n", "missing column(s) case_id, model, gpu"),
        (b"case_id,model,gpu,num_gpus\n", "no rows under the header"),
        (b"\x7fELF\x02\x01\x01\x00\xff\xfe\x00\x00", "not UTF-8 CSV text"),
        # a row with more cells than the header: which line, not a crash
        (b"case_id,model,gpu\nx1,Qwen2.5-7B,H100\nx2,Qwen2.5-7B,H100,8,extra\n", "line(s) 3: more"),
        (b"case_id,model,gpu\nx1,Qwen2.5-7B,H100\nx1,Qwen2.5-7B,A100\n", "case_id repeated: 'x1'"),
    ],
)
def test_a_file_that_is_not_a_data_set_is_refused_with_what_is_missing(
    tmp_path, capsys, content, message
):
    from rpeg.cli import main

    path = tmp_path / "runs.csv"
    path.write_bytes(content)
    code = main(["validate", str(path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"  - {path}: {message}" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "content",
    [
        # a spreadsheet's UTF-8 export with a byte-order mark; ';' and tab between cells; a
        # short row whose trailing blank cells are left out
        "\ufeffcase_id,source,model,gpu,num_gpus,num_prompts,samples_per_prompt,measured_step_s\n"
        "x1,s,Qwen2.5-7B,H100,16,64,8,100\n",
        "case_id;source;model;gpu;num_gpus;num_prompts;samples_per_prompt;measured_step_s\n"
        "x1;s;Qwen2.5-7B;H100;16;64;8;100\n",
        "case_id\tsource\tmodel\tgpu\tnum_gpus\tnum_prompts\tsamples_per_prompt\tmeasured_step_s\n"
        "x1\ts\tQwen2.5-7B\tH100\t16\t64\t8\t100\n",
        "case_id,source,model,gpu,num_gpus,num_prompts,samples_per_prompt,measured_step_s,notes\n"
        "x1,s,Qwen2.5-7B,H100,16,64,8,100\n",
    ],
)
def test_spreadsheet_exports_read_as_the_same_row(tmp_path, content):
    path = tmp_path / "runs.csv"
    path.write_text(content, encoding="utf-8")
    (row,) = read_rows(path)
    assert row["case_id"] == "x1" and row["measured_step_s"] == "100"
    assert all(isinstance(v, str) for v in row.values())
