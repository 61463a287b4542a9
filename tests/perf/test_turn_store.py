"""The turn shape `rpeg calibrate` fits on a multi-turn run is kept per cluster, model and
task in calibration.yaml; a later prediction of that task takes the values its config does
not state (rpeg.perf.calibration.turn_store). Values written by hand."""

from rpeg.perf.calibration import turn_store as TS
from rpeg.perf.calibration.run_lengths import task_key


def _cfg(**over):
    from rpeg.config import RunConfig

    return RunConfig.from_yaml("configs/tool-cpu.yaml").with_overrides(over)


def _workload(cfg):
    from rpeg.perf.prediction import Workload

    return Workload.from_config(cfg.workload, cfg.model.lora, cfg.task.multiturn)


SHAPE = TS.StoredTurns(
    mean_turns=1.75,
    observation_tokens=13.0,
    env_latency_s=0.0015,
    mean_turn_tokens=22.0,
    source="runs/tool",
)


def test_store_and_lookup_keep_other_entries(tmp_path):
    path = tmp_path / "calibration.yaml"
    path.write_text("clusters:\n  local-cpu:\n    gen_eff_scale: 0.5\n    lengths: {a: 1}\n")
    TS.store("local-cpu", "k1", SHAPE, path)
    TS.store("local-cpu", "k2", TS.StoredTurns(2.0, 16.0, 0.01), path)
    assert TS.lookup("local-cpu", "k1", path) == SHAPE
    assert TS.lookup("local-cpu", "k2", path) == TS.StoredTurns(2.0, 16.0, 0.01)
    assert TS.lookup("local-cpu", "k3", path) is None
    assert TS.lookup("other", "k1", path) is None
    text = path.read_text()
    assert "gen_eff_scale: 0.5" in text and "lengths:" in text  # the cluster's, kept


def test_a_later_prediction_takes_what_its_config_does_not_state(tmp_path):
    path = tmp_path / "calibration.yaml"
    cfg = _cfg()
    TS.store("local-cpu", TS.turn_key(cfg, task_key(cfg)), SHAPE, path)
    got = TS.with_stored_turns(_workload(cfg), cfg, "local-cpu", task_key(cfg), path)
    t = got.turns
    assert (t.mean_turns, t.mean_turn_tokens, t.observation_tokens, t.env_latency_s) == (
        1.75,
        22.0,
        13.0,
        0.0015,
    )
    assert got.assumed[-1] == (
        "turn shape measured by rpeg calibrate on runs/tool: mean_turns 1.75, "
        "mean_turn_tokens 22, observation_tokens 13, env_latency_s 0.0015"
    )
    # a value the config states wins; the others still come from the run
    stated = _cfg(**{"task.multiturn.env_latency_s": 0.5})
    t = TS.with_stored_turns(_workload(stated), stated, "local-cpu", task_key(stated), path).turns
    assert t.env_latency_s == 0.5 and t.mean_turns == 1.75
    # another turn cap is another task: nothing applies
    other = _cfg(**{"task.multiturn.max_turns": 3})
    assert TS.turn_key(other, task_key(other)) != TS.turn_key(cfg, task_key(cfg))
    wl = _workload(other)
    assert TS.with_stored_turns(wl, other, "local-cpu", task_key(other), path) is wl
    # another cluster: nothing stored there
    wl = _workload(cfg)
    assert TS.with_stored_turns(wl, cfg, "a100-80g", task_key(cfg), path) is wl


def test_a_config_written_out_whole_states_only_what_differs_from_the_defaults(tmp_path):
    """`rpeg config` writes every field (observation_tokens: 16.0, mean_turns: null, ...):
    values at their defaults are not statements, a changed one is."""
    from rpeg.config import RunConfig

    path = tmp_path / "calibration.yaml"
    whole = tmp_path / "whole.yaml"
    whole.write_text(_cfg(**{"task.multiturn.observation_tokens": 9.0}).to_yaml())
    cfg = RunConfig.from_yaml(str(whole))
    assert "env_latency_s" in cfg.task.multiturn.model_fields_set
    TS.store("local-cpu", TS.turn_key(cfg, task_key(cfg)), SHAPE, path)
    t = TS.with_stored_turns(_workload(cfg), cfg, "local-cpu", task_key(cfg), path).turns
    assert (t.mean_turns, t.env_latency_s, t.observation_tokens) == (1.75, 0.0015, 9.0)


def test_stored_means_are_clamped_to_a_later_configs_caps(tmp_path):
    path = tmp_path / "calibration.yaml"
    cfg = _cfg(**{"task.multiturn.max_turns": 3})
    TS.store(
        "local-cpu",
        TS.turn_key(cfg, task_key(cfg)),
        TS.StoredTurns(2.5, 13.0, 0.001, mean_turn_tokens=40.0, source="r"),
        path,
    )
    t = TS.with_stored_turns(_workload(cfg), cfg, "local-cpu", task_key(cfg), path).turns
    assert t.mean_turns == 2.5 and t.mean_turn_tokens == 28.0  # the turn cap is 28


def test_the_runs_prompt_and_transcript_apply_where_the_workload_states_none(tmp_path):
    path = tmp_path / "calibration.yaml"
    cfg = _cfg()
    kept = TS.StoredTurns(1.5, 20.0, 0.01, prompt_tokens=26.0, response_tokens=23.2, source="r")
    TS.store("local-cpu", TS.turn_key(cfg, task_key(cfg)), kept, path)
    got = TS.with_stored_turns(_workload(cfg), cfg, "local-cpu", task_key(cfg), path)
    assert (got.mean_prompt_tokens, got.mean_response_tokens) == (26.0, 23.2)
    assert got.assumed[-1].endswith("26 prompt tokens, 23.2 transcript tokens")
    own = _cfg(**{"workload.mean_response_tokens": 30.0})
    got = TS.with_stored_turns(_workload(own), own, "local-cpu", task_key(own), path)
    assert (got.mean_prompt_tokens, got.mean_response_tokens) == (26.0, 30.0)


def test_a_row_missing_a_number_is_not_used(tmp_path):
    path = tmp_path / "calibration.yaml"
    path.write_text("clusters:\n  c:\n    turns:\n      k: {mean_turns: 1.5, source: x}\n")
    assert TS.lookup("c", "k", path) is None
