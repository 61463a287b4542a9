"""The built-in tool task: its problems, its warm-up transcripts (loss only on the model's
tokens, the rollout's layout), and a short local run (slow)."""

import pytest

from rpeg.runtime.data import Example
from rpeg.runtime.envs.answers import final_answer, final_answer_reward
from rpeg.runtime.envs.tool_task import ToolArithmeticSource
from rpeg.runtime.tokenizer import build_char_tokenizer

from .scripted import BOS, EOS, ch


def test_problems_are_seeded_and_answers_exact():
    src = ToolArithmeticSource(1, seed=0)
    ex = src[3]
    assert src[3] == ex and ToolArithmeticSource(1, seed=0)[3] == ex
    a, b = (int(x) for x in ex.solution.split("*"))
    assert ex.question == f"{a} boxes of {b} pens. Pens?"
    assert ex.answer == str(a * b) and 2 <= a < 10 and 10 <= b < 100


def test_warmup_transcripts_train_only_model_tokens():
    tok = build_char_tokenizer()
    ex = Example("7 boxes of 12 pens. Pens?", "84", solution="7*12")
    tool = ToolArithmeticSource(tool_share=1.0)
    direct = ToolArithmeticSource(tool_share=0.0)
    ids, mask, loss = tool.sft_batch(tok, [ex], "{question}")
    prompt = [BOS, *ch("7 boxes of 12 pens. Pens?")]  # 26 ids
    call, obs, ans = ch("<tool>calc(7*12)</tool>"), ch("<result>84</result>"), ch("84")
    assert ids[0].tolist() == prompt + call + obs + ans + [EOS]
    assert mask[0].tolist() == [1] * (26 + 23 + 19 + 3)
    assert loss[0].tolist() == [0] * 26 + [1] * 23 + [0] * 19 + [1] * 3
    ids, _, loss = direct.sft_batch(tok, [ex], "{question}")
    assert ids[0].tolist() == prompt + ans + [EOS]
    assert loss[0].tolist() == [0] * 26 + [1] * 3


def test_tool_share_splits_questions():
    src = ToolArithmeticSource(1, seed=0, tool_share=0.3)
    share = sum(src.uses_tool(src[i]) for i in range(1000)) / 1000
    assert 0.25 < share < 0.35


def test_final_answer():
    assert final_answer("<tool>calc(7*12)</tool><result>84</result> 84") == "84"
    assert final_answer("<tool>calc(7/0)</tool><error>division by zero</error>5") == "5"
    assert final_answer("84") == "84"
    assert final_answer_reward("", "<tool>calc(7*12)</tool><result>84</result>83", "84") == 0.0
    assert final_answer_reward("", "<tool>calc(7*12)</tool>", "84") == 0.0


@pytest.mark.slow
def test_local_run_reports_tool_metrics(tmp_path, monkeypatch):
    """Two RL steps of configs/tool-cpu.yaml, shrunk: every step has the multi-turn metrics,
    the summary has the tool-use rates; the reward rule is the final answer's."""
    from rpeg.config import RunConfig
    from rpeg.runtime.local_trainer import LocalTrainer

    monkeypatch.setenv("RPEG_CACHE", str(tmp_path / "cache"))
    c = RunConfig.from_yaml("configs/tool-cpu.yaml").with_overrides(
        {
            "optim.warmup_sft_steps": 2,
            "runtime.steps": 2,
            "workload.num_prompts": 2,
            "workload.samples_per_prompt": 2,
            "workload.train_minibatches": 1,
            "task.heldout_size": 2,
            "runtime.output_dir": str(tmp_path / "out"),
        }
    )
    summary = LocalTrainer(c).run()
    assert summary["steps"] == 2
    assert 0.0 <= summary["tool_use_rate_first10"] <= 1.0
    assert "tool_use_rate_last10" in summary and "heldout_acc_after" in summary
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all('"tool_use_rate"' in x and '"turns_mean"' in x for x in lines)
