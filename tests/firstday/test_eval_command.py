"""Issue 41 item 3: ``rpeg eval CHECKPOINT|HF_FOLDER|RUN_FOLDER --data FILE [--samples k]
[--json]`` prints accuracy and pass@k per data source."""

from __future__ import annotations

import json

import pytest

from rpeg.cli import main
from rpeg.config import RunConfig
from rpeg.runtime.rewards import register_reward
from tests.firstday.conftest import run_yaml

ALWAYS = "*"  # a reference the test reward counts as right whatever the answer


@register_reward("eval_echo_test", bounded=True, overwrite=True)
def _echo(prompt: str, response: str, reference: str) -> float:
    """Right when the response is the reference (or the reference is ALWAYS)."""
    return 1.0 if reference == ALWAYS or response.strip() == reference.strip() else 0.0


def _rows(answers: list[tuple[str, str]]) -> str:
    return "".join(
        json.dumps(
            {
                "data_source": src,
                "prompt": [{"role": "user", "content": f"What is {i} plus 1?"}],
                "reward_model": {"ground_truth": ans},  # as verl's (the config's answer_key)
            }
        )
        + "\n"
        for i, (src, ans) in enumerate(answers)
    )


def _cfg(tmp_path, user_files, **over) -> str:
    cfg = RunConfig.from_yaml(run_yaml(user_files, tmp_path)).with_overrides(
        {"task.rewards": ["eval_echo_test"], **over}
    )
    path = tmp_path / "eval.yaml"
    path.write_text(cfg.to_yaml())
    return str(path)


def _eval(capsys, *args) -> tuple[int, str, str]:
    code = main(["eval", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_pass_at_k_and_accuracy_per_data_source_as_json(user_files, tmp_path, capsys):
    data = tmp_path / "mixed.jsonl"
    # source a: always right; source b: a reference no response is
    data.write_text(_rows([("a", ALWAYS), ("b", "no answer is this"), ("a", ALWAYS)]))
    cfg = _cfg(tmp_path, user_files)
    code, out, err = _eval(
        capsys,
        user_files["model"],
        "--data",
        str(data),
        "--samples",
        "3",
        "--json",
        "--config",
        cfg,
    )
    assert code == 0, err
    got = json.loads(out)
    m = got["metrics"]
    assert got["prompts"] == 3 and got["samples"] == 3
    assert m["val/a/accuracy"] == 1.0 and m["val/a/pass@3"] == 1.0
    assert m["val/b/accuracy"] == 0.0 and m["val/b/pass@3"] == 0.0
    assert m["val/accuracy"] == pytest.approx(2 / 3) and m["val/pass@3"] == pytest.approx(2 / 3)


def test_greedy_accuracy_matches_what_transformers_generates(user_files, tmp_path, capsys):
    """The greedy answers are the model's own (checked against transformers' generate): rows
    whose reference is that answer count as right, the others not."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(user_files["model"])
    model = AutoModelForCausalLM.from_pretrained(user_files["model"]).eval()
    new_tokens = RunConfig().workload.max_response_tokens

    def greedy(i: int) -> str:
        text = tok.apply_chat_template(
            [{"role": "user", "content": f"What is {i} plus 1?"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        ids = torch.tensor([tok(text)["input_ids"]])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
        return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    answers = [("x", greedy(0)), ("y", greedy(1) + " not"), ("x", greedy(2))]
    data = tmp_path / "own.jsonl"
    data.write_text(_rows(answers))
    code, out, err = _eval(
        capsys, user_files["model"], "--data", str(data), "--config", _cfg(tmp_path, user_files)
    )
    assert code == 0, err
    table = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:]}
    assert table["x"] == ["1.000"] and table["y"] == ["0.000"] and table["all"] == ["0.667"]


def test_a_run_folder_and_a_checkpoint_are_evaluated_from_their_weights(
    user_files, tmp_path, capsys
):
    """A run folder's config.yaml is read (no --config); its checkpoint's trained weights are
    the ones evaluated (the same metrics as the checkpoint named directly)."""
    from rpeg.runtime.datasets.fit import fit_prompt_lengths
    from rpeg.runtime.local_trainer import LocalTrainer

    cfg = RunConfig.from_yaml(_cfg(tmp_path, user_files, **{"workload.max_prompt_tokens": 64}))
    cfg = fit_prompt_lengths(cfg).with_overrides(
        {"runtime.steps": 1, "runtime.checkpoint_every": 1, "runtime.val_before_train": False}
    )
    LocalTrainer(cfg).run()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(cfg.to_yaml())
    data = tmp_path / "d.jsonl"
    data.write_text(_rows([("a", ALWAYS), ("b", "never")]))
    code, out, err = _eval(capsys, str(run), "--data", str(data), "--json")
    assert code == 0, err
    from_run = json.loads(out)
    assert from_run["metrics"]["val/a/accuracy"] == 1.0
    assert "checkpoint" in from_run["model"]
    code, out, err = _eval(
        capsys,
        str(tmp_path / "ckpt"),
        "--data",
        str(data),
        "--json",
        "--config",
        str(run / "config.yaml"),
    )
    assert code == 0, err
    assert json.loads(out)["metrics"] == from_run["metrics"]
    # a run folder whose own run wrote no checkpoint is refused, even when another run's
    # checkpoints sit at the same checkpoint_url
    other = tmp_path / "other"
    other.mkdir()
    trained = {"runtime.run_id": "never-checkpointed"}
    (other / "config.yaml").write_text(cfg.with_overrides(trained).to_yaml())
    code, _, err = _eval(capsys, str(other), "--data", str(data))
    assert code == 2 and "has no checkpoint" in err


def test_what_is_not_a_model_is_refused_with_exit_2(tmp_path, capsys, user_files):
    data = tmp_path / "d.jsonl"
    data.write_text(_rows([("a", "1")]))
    code, _, err = _eval(capsys, str(tmp_path), "--data", str(data))
    assert code == 2 and "neither a run folder" in err
    code, _, err = _eval(capsys, user_files["model"], "--data", str(tmp_path / "none.jsonl"))
    assert code == 2 and "--data" in err and "not found" in err
    code, _, err = _eval(capsys, user_files["model"], "--data", str(data), "--samples", "0")
    assert code == 2 and "--samples" in err
