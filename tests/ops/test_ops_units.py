"""Fast checks of the ops layer: parameter models and the form schema, human error
messages, promotion rule, newest data, the latest-good pointer, run folders, pictures and
artifact helpers outside a run (the services: tests/ops/test_ops_services.py)."""

from __future__ import annotations

import base64
import inspect
import io
import os
import time
from pathlib import Path

import pytest
from rpeg.flows.params import (
    RetrainParams,
    TrainParams,
    form_defaults,
    one_line,
    parse_param_assignments,
    validate_params,
)

from rpeg.errors import ConfigError

TINY = Path(__file__).parent / "data" / "tiny.yaml"
ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------- parameters
def test_train_params_apply_to_the_config():
    p = TrainParams(
        config=str(TINY), steps=3, lr=1e-5, max_staleness=1, cluster_address="tcp://10.0.0.5:8786"
    )
    cfg = p.resolve()
    assert cfg.runtime.steps == 3 and cfg.optim.lr == 1e-5 and cfg.runtime.max_staleness == 1
    assert cfg.cluster.address == "tcp://10.0.0.5:8786"
    # empty text fields keep the config's values (tiny.yaml sets no checkpoint URL)
    assert cfg.runtime.checkpoint_url is None and cfg.runtime.output_dir == "runs/ops-tiny"
    # the built-in config when no path is given
    assert TrainParams().resolve().model.name == "rpeg-tiny"


def test_refusals_read_like_sentences():
    with pytest.raises(ConfigError) as e:
        validate_params(
            TrainParams,
            {"steps": -1, "lr": 0, "cluster_address": "10.0.0.5", "surprise": 1, "newest_by": 3},
        )
    lines = [str(p) for p in e.value.problems]
    assert "Steps (steps): must be at least 1 (got -1)" in lines
    assert "Learning rate (lr): must be more than 0.0 (got 0)" in lines
    assert any(
        x.startswith("Dask scheduler address (cluster_address): must look like tcp://")
        for x in lines
    )
    assert any(
        x.startswith("surprise: unknown parameter; the parameters are: steps, lr,") for x in lines
    )
    assert len(lines) == 5  # newest_by is unknown to TrainParams: every problem, at once
    text = one_line(e.value)
    assert "\n" not in text and text.startswith("parameters refused: Steps (steps)")
    with pytest.raises(ConfigError) as e:
        validate_params(RetrainParams, {"engine": "gpu", "tolerance": 2})
    lines = [str(p) for p in e.value.problems]
    assert "Engine (engine): must be one of 'dask' or 'local' (got 'gpu')" in lines
    assert any(x.startswith("Promotion tolerance") and "at most 1.0 (got 2)" in x for x in lines)


def test_missing_config_is_one_line():
    with pytest.raises(ConfigError) as e:
        TrainParams(config="/nope/run.yaml").resolve()
    line = one_line(e.value)
    assert line.startswith("run config not found: config: no such file: /nope/run.yaml")
    assert "\n" not in line and "Traceback" not in line


def test_form_defaults_come_from_the_config():
    d = form_defaults(TrainParams, str(TINY), steps=5)
    # tiny.yaml: 4 prompts x 4 samples (rpeg/config/ defaults are 16 x 8); steps given
    assert (d["num_prompts"], d["samples_per_prompt"], d["steps"]) == (4, 4, 5)
    assert d["config"] == str(TINY) and d["output_dir"] == "" and d["overrides"] == {}
    r = form_defaults(RetrainParams, str(TINY), checkpoint_url="memory://c")
    assert r["steps"] == 10  # retrain counts steps beyond the checkpoint, not the config's


def test_form_schema_is_flat_typed_and_ordered():
    """The schema Prefect builds from the flow signatures: steps first, no nullable
    fields, human titles, ranges; the signature mirrors the pydantic model."""
    from prefect.utilities.callables import parameter_schema
    from rpeg.flows.retrain import retrain
    from rpeg.flows.train_form import train

    for fl, model in ((train, TrainParams), (retrain, RetrainParams)):
        s = parameter_schema(fl.fn).model_dump_for_openapi()
        props = s["properties"]
        order = sorted(props, key=lambda k: props[k]["position"])
        assert order == list(model.model_fields), fl.name
        assert order[0] == "steps"
        sig = inspect.signature(fl.fn)
        for name, info in model.model_fields.items():
            prop = props[name]
            assert "anyOf" not in prop and prop.get("type") != "null", name
            assert prop["title"] == info.title and prop["title"] != name, name
            assert prop["description"] == info.description, name
            assert sig.parameters[name].default == info.get_default(call_default_factory=True)
        assert "required" not in s  # every field has a default
    steps = parameter_schema(train.fn).model_dump_for_openapi()["properties"]["steps"]
    assert (steps["type"], steps["minimum"], steps["maximum"]) == ("integer", 1, 10_000_000)
    lr = parameter_schema(train.fn).model_dump_for_openapi()["properties"]["lr"]
    assert lr["exclusiveMinimum"] == 0 and lr["maximum"] == 1
    for name, prop in parameter_schema(retrain.fn).model_dump_for_openapi()["properties"].items():
        assert "<" not in prop["description"], f"{name}: the UI renders descriptions as HTML"


def test_retrain_params_resolve_steps_beyond_checkpoint():
    p = RetrainParams(config=str(TINY), checkpoint_url="memory://ck", steps=5)
    cfg = p.resolve(base_step=10, data_url="s3://b/new.parquet")
    assert cfg.runtime.steps == 15 and cfg.runtime.resume
    assert cfg.task.kind == "parquet" and cfg.task.url == "s3://b/new.parquet"
    with pytest.raises(ConfigError, match="checkpoint URL"):
        RetrainParams(config=str(TINY)).resolve()


def test_parse_param_assignments():
    assert parse_param_assignments(["steps=5", "lr=1e-5", "resume=true", "output_dir="]) == {
        "steps": 5,
        "lr": 1e-5,
        "resume": True,
        "output_dir": "",
    }
    with pytest.raises(ConfigError):
        parse_param_assignments(["nothing"])


# ---------------------------------------------------------------------- promotion
def test_should_promote_rule():
    from rpeg.flows.promotion import should_promote

    assert should_promote(0.5, None)[0]
    assert should_promote(0.5, {"score": 0.5})[0]
    assert not should_promote(0.4, {"score": 0.5})[0]
    assert should_promote(0.45, {"score": 0.5}, tolerance=0.05)[0]
    assert not should_promote(float("nan"), None)[0]


def test_newest_file_by_mtime_and_name(tmp_path):
    from rpeg.flows.promotion import newest_file

    assert newest_file(str(tmp_path / "*.jsonl")) is None
    (tmp_path / "z.jsonl").write_text("{}\n")
    (tmp_path / "a.jsonl").write_text("{}\n")
    old = time.time() - 100
    os.utime(tmp_path / "z.jsonl", (old, old))
    assert newest_file(str(tmp_path / "*.jsonl")).endswith("a.jsonl")
    assert newest_file(str(tmp_path / "*.jsonl"), "name").endswith("z.jsonl")
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/ops-data/d1.jsonl", b"{}\n")
    assert (
        newest_file("memory://ops-data/*.jsonl").replace(":///", "://")
        == "memory://ops-data/d1.jsonl"
    )


def test_latest_good_pointer_and_copy(tmp_path):
    from rpeg.flows.promotion import latest_step, read_latest_good, write_latest_good

    from rpeg.runtime.actors.checkpoint import CheckpointStore

    url = str(tmp_path / "ck")
    store = CheckpointStore(url, keep_last=1)
    store.save(3, {"a.pt": b"x"})
    assert latest_step(url) == 3 and read_latest_good(url) is None
    rec = write_latest_good(url, {"step": 3, "score": 0.5}, copy_step=3)
    assert rec["copy"] == str(tmp_path / "ck" / "latest-good")  # what the artifact names
    assert read_latest_good(url)["score"] == 0.5
    assert (tmp_path / "ck" / "latest-good" / "COMMIT.json").exists()
    store.save(4, {"a.pt": b"y"})  # prunes step 3 (keep_last=1) ...
    assert not (tmp_path / "ck" / "step-00000003").exists()
    assert (tmp_path / "ck" / "latest-good" / "a.pt").read_bytes() == b"x"  # ... the copy stays
    assert CheckpointStore(url).complete_steps() == [4]  # the pointer files are not checkpoints


# ---------------------------------------------------------------------- run folders
def test_run_folder_and_latest_pointer(tmp_path):
    from rpeg.flows.outputs import base_folder, point_latest, run_folder

    assert base_folder("runs/latest") == Path("runs")
    assert base_folder("runs/exp1") == Path("runs/exp1")
    assert base_folder("runs/latest", "/data/out") == Path("/data/out")
    a = run_folder(tmp_path, "tiny-2-steps-abc123")
    b = run_folder(tmp_path, "tiny 2/steps?")
    assert a.name == "tiny-2-steps-abc123" and b.name == "tiny-2-steps" and b.parent == tmp_path
    point_latest(a)
    assert (tmp_path / "latest").resolve() == a.resolve()
    point_latest(b)
    assert (tmp_path / "latest").resolve() == b.resolve() and os.readlink(
        tmp_path / "latest"
    ) == b.name
    real = tmp_path / "other"
    (real / "latest").mkdir(parents=True)  # a real runs/latest folder (rpeg train) stays
    assert point_latest(run_folder(real, "r1")) is None and (real / "latest").is_dir()


# ---------------------------------------------------------------------- pictures
def _png_size(png: bytes) -> tuple[int, int]:
    import matplotlib.image as mpimg

    img = mpimg.imread(io.BytesIO(png), format="png")
    return img.shape[1], img.shape[0]


def test_pictures_are_pngs_embedded_as_data_uris():
    from rpeg.flows import reports

    hist = [{"step": i + 1, "reward_mean": 0.1 * i, "accuracy": 0.05 * i} for i in range(5)]
    png = reports.curve_png(hist, heldout=(0.1, 0.4))
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and _png_size(png) == (640, 272)  # 8 x 3.4 in, 80 dpi
    assert reports.curve_png([]) is None
    md = reports.image_markdown(png, "curve")
    assert md.startswith("![curve](data:image/png;base64,")
    assert base64.b64decode(md[len("![curve](data:image/png;base64,") : -1]) == png
    from rpeg.perf.timeline import TimelineRecord

    meas = [
        TimelineRecord("generate", "0-1", 5.0, 6.5, step=3, source="measured"),
        TimelineRecord("train_actor", "0-1", 6.5, 7.0, step=3, source="measured"),
        TimelineRecord("generate", "0-1", 0.0, 1.0, step=2, source="measured"),
    ]
    last = reports.last_step_records(meas)
    assert [(r.stage, r.start_s, r.end_s) for r in last] == [
        ("generate", 0.0, 1.5),
        ("train_actor", 1.5, 2.0),
    ]
    g = reports.gantt_png(last, [TimelineRecord("generate", "0-1", 0.0, 1.2)])
    assert g[:4] == b"\x89PNG" and reports.gantt_png([], []) is None


def test_plan_report_has_the_graph_picture_and_predicted_stages():
    from rpeg.flows import reports
    from rpeg.flows.params import load_config

    from rpeg.ir.visual import has_graphviz

    md, predicted = reports.plan_report(load_config(str(TINY)))
    assert md.startswith("# Execution plan") and "```yaml" in md
    stages = {r.stage for r in predicted}
    assert {"generate", "train_actor"} <= stages
    assert all(f"| {s} |" in md for s in stages)
    if has_graphviz():
        assert "![the RL step as a graph](data:image/png;base64," in md


def test_artifact_helpers_are_noops_outside_a_run(tmp_path):
    from rpeg.flows import artifacts as art

    assert not art.in_prefect_run()
    assert art.publish_step(1, 2, {"reward_mean": 0.5}) is None
    assert art.publish_metrics_table([{"step": 0.0}]) is None
    assert art.publish_checkpoint(str(tmp_path), 1) is None
    assert art.publish_timeline([], tmp_path / "t.png") is None
    assert art.publish_curve([{"step": 0.0, "reward_mean": 1.0}]) is None
    assert art.publish_refused("no") is None
    assert art.publish_results({"steps": 1}, tmp_path) is None
    assert art.artifact_key("RL_Train", "Metrics") == "rl-train-metrics"
    line = art.format_step_line(
        3, 20, {"step": 2.0, "reward_mean": 0.4123, "step_s": 0.5, "zeta": 1.0}
    )
    assert line == "step 3/20 reward_mean=0.4123 step_s=0.5 zeta=1"
    # locations are text: a path in code font, a link only for http(s)
    assert art.location_text(str(tmp_path)) == f"`{tmp_path}`"
    assert art.location_text("s3://b/ck/step-1") == "`s3://b/ck/step-1`"
    assert art.location_text("https://h/x") == "[`https://h/x`](https://h/x)"
    assert "file://" not in art.summary_markdown({"steps": 2}, out_dir=tmp_path)
