"""`rpeg plan` from flags (JSON), from a config with --out, and bad input (exit 2)."""

import json

from rpeg.cli import main
from rpeg.plan import Plan

FLAGS = [
    "plan",
    "--model",
    "qwen2.5-7b",
    "--gpu",
    "gh200",
    "--gpus",
    "8",
    "--algo",
    "grpo",
    "--num-prompts",
    "64",
    "--samples-per-prompt",
    "8",
    "--max-response-tokens",
    "4096",
    "--max-staleness",
    "1",
]


def test_flags_json(capsys):
    assert main([*FLAGS, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["predicted_step_s"] > 0 and d["search_s"] >= 0
    for k in ("verl", "real", "areal"):
        assert "predicted_step_s" in d["baselines"][k]
    plan = Plan.from_dict(d["plan"])
    assert plan.cluster == "gh200-alps" and plan.num_nodes == 2
    assert plan.model == "qwen2.5-7b"  # a catalog name is taken as it is


def test_config_out_writes_plan_graph_and_gantt(tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("algorithm: {name: grpo}\nruntime: {max_staleness: 1}\n")
    out = tmp_path / "p" / "plan.yaml"
    assert main(["plan", str(cfg), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "predicted step" in text and "verl" in text
    assert Plan.from_yaml(out).model == "rpeg-tiny"
    assert (tmp_path / "p" / "plan.gantt.png").exists()
    assert (tmp_path / "p" / "plan.graph.dot").exists()
    assert (tmp_path / "p" / "plan.config.yaml").exists()


def test_sweep_json(tmp_path, capsys):
    out = tmp_path / "s.yaml"
    args = [a if a != "8" else "4" for a in FLAGS]
    assert main([*args, "--sweep", "4,8", "--json", "--out", str(out)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["gpus"] for r in d["sweep"]] == [4, 8]
    assert (tmp_path / "s.sweep.png").exists()


def test_unknown_model_exits_2_naming_allowed(capsys):
    assert main(["plan", "--model", "gpt-9", "--gpu", "gh200", "--gpus", "8", "--json"]) == 2
    err = capsys.readouterr().err
    assert "gpt-9" in err and "qwen2.5-7b-instruct" in err


def test_unknown_gpu_exits_2_naming_allowed(capsys):
    assert main(["plan", "--model", "qwen2.5-7b", "--gpu", "tpu-v9", "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert "tpu-v9" in err and "gh200" in err


def test_bad_mode_and_sweep(capsys):
    assert main([*FLAGS, "--mode", "magic"]) == 2
    assert main([*FLAGS, "--sweep", "a,b"]) == 2


def test_model_names_fall_back_to_instruct_and_lower_case():
    from rpeg.search.problem import resolve_model

    # the catalog has only the -instruct entry of qwen2.5-14b, and qwen3-8b in lower case
    assert resolve_model("qwen2.5-14b").name == "qwen2.5-14b-instruct"
    assert resolve_model("Qwen3-8B").name == "qwen3-8b"
    assert resolve_model("qwen2.5-32b").name == "qwen2.5-32b"  # both exist: the exact one


def test_published_checkpoint_names_find_their_catalog_entry():
    from rpeg.search.problem import resolve_model

    assert resolve_model("Qwen/Qwen2.5-7B-Instruct").name == "qwen2.5-7b-instruct"
    assert resolve_model("meta-llama/Meta-Llama-3.1-8B-Instruct").name == "llama3.1-8b"
    assert resolve_model("Qwen/Qwen3-30B-A3B-FP8").name == "qwen3-30b-a3b"


def test_a_size_only_name_is_not_planned_with_a_stand_in(capsys):
    """rpeg validate prices `Acme-7B` with a stand-in architecture; a plan needs the real
    one: refused, naming the closest entries and how to add it."""
    assert main(["plan", "--model", "Acme-7B", "--gpu", "h100", "--gpus", "8", "--json"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Acme-7B" in err and "rpeg specs add-model --from-hf" in err
    assert (
        main(["plan", "--model", "Qwen/Qwen2.5-8B-Instruct", "--gpu", "h100", "--gpus", "8"]) == 2
    )
    err = " ".join(capsys.readouterr().err.split())
    assert "closest: qwen2.5-7b-instruct" in err


def test_gpu_names_as_published_find_their_cluster():
    from rpeg.search.inputs import cluster_for_gpu

    assert cluster_for_gpu("H100 80GB") == cluster_for_gpu("h100") == "dgx-h100"
    assert cluster_for_gpu("NVIDIA H100") == "dgx-h100"
    assert cluster_for_gpu("A100-40GB") != cluster_for_gpu("A100-80GB")


def test_a_gpu_count_in_the_gpu_flag_is_refused(capsys):
    assert main(["plan", "--model", "qwen2.5-7b", "--gpu", "8xH100", "--gpus", "16"]) == 2
    assert "count in --gpus" in " ".join(capsys.readouterr().err.split())
