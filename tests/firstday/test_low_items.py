"""Issue 41's Low items: the summary's reward before/after compares different windows on
short runs; ``rpeg --help`` does not wrap mid-sentence; the console's samples show the
question; exported weights are readable by others (0644)."""

from __future__ import annotations

from rpeg.runtime.summary import run_summary


def _summary(rewards: list[float]) -> dict:
    hist = [{"reward_mean": r, "step_s": 1.0} for r in rewards]
    return run_summary(hist, wall_s=1.0, acc_before=None, acc_after=None)


def test_reward_before_after_compares_different_steps_on_short_runs():
    # 6 steps (a 10-step window would be the whole run twice): steps 1-3 vs 4-6
    s = _summary([0.0, 0.0, 0.3, 0.6, 0.9, 0.9])
    assert s["reward_first10"] == (0.0 + 0.0 + 0.3) / 3
    assert s["reward_last10"] == (0.6 + 0.9 + 0.9) / 3
    two = _summary([0.25, 0.75])  # step 1 vs step 2
    assert (two["reward_first10"], two["reward_last10"]) == (0.25, 0.75)
    # 25 steps: the first ten vs the last ten, as before
    long = _summary([0.0] * 10 + [0.5] * 5 + [1.0] * 10)
    assert (long["reward_first10"], long["reward_last10"]) == (0.0, 1.0)


def _help(*args: str, columns: int) -> list[str]:
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": str(columns)}
    code = "import sys; from rpeg.cli import main; sys.exit(main(sys.argv[1:]))"
    res = subprocess.run(
        [sys.executable, "-c", code, *args, "--help"], capture_output=True, text=True, env=env
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def _entries(lines: list[str]) -> dict[str, list[str]]:
    """The Commands panel: each command's description lines."""
    panel = lines[next(i for i, ln in enumerate(lines) if "Commands" in ln) + 1 :]
    out: dict[str, list[str]] = {}
    name = None
    for ln in panel:
        if not ln.startswith("│"):
            break
        body = ln.strip("│").rstrip()
        if body[:1] == " " and body[1:2] != " ":  # " train      Train a policy ..."
            name, text = body.split(None, 1)
            out[name] = [text.strip()]
        elif name:
            out[name].append(body.strip())
    return out


def test_rpeg_help_wraps_paragraphs_not_source_lines():
    # a wide terminal: each command's paragraph is one line (it was cut at the source's breaks)
    wide = _entries(_help(columns=1000))
    assert {"train", "validate", "calibrate", "export", "bench"} <= set(wide)
    assert all(len(v) == 1 for v in wide.values()), {k: v for k, v in wide.items() if len(v) > 1}
    # 80 columns: every line but an entry's last is filled (no short line mid-sentence)
    narrow = _entries(_help(columns=80))
    for name, lines in narrow.items():
        width = max(len(x) for x in lines)
        for ln, nxt in zip(lines, lines[1:], strict=False):
            assert len(ln) + 1 + len(nxt.split()[0]) > width, (name, ln, nxt)
    # a command's own help: its first paragraph reflowed the same way
    own = [x.strip() for x in _help("export", columns=1000) if x.strip()]
    assert any(x.startswith("Write the checkpoint's policy") and x.endswith(".json.") for x in own)


def test_exported_weights_are_readable_by_others(tmp_path):
    """safetensors writes its files 0600; an export is for others to load (0644)."""
    import stat

    from rpeg.runtime.export import export_checkpoint
    from tests.safety.test_export_out import _checkpoint

    out = tmp_path / "hf"
    export_checkpoint(_checkpoint(tmp_path), str(out))
    weights = list(out.glob("*.safetensors"))
    assert weights
    for f in weights:
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, (f.name, oct(f.stat().st_mode))


QUESTION = "Natalia sold clips to 48 of her friends.\nHow many clips did she sell?"


def _sample(prompt: str):
    from rpeg.runtime.samples import Sample

    return Sample(3, 0, prompt, "48 + 24 = 72.\n#### 72", "72", 1.0, 1.0, 0.5, 12, 2)


def test_console_sample_shows_the_question_of_a_chat_prompt():
    from rpeg.runtime.samples import sample_lines
    from tests.firstday.tiny_hf import build_tokenizer

    messages = [
        {"role": "system", "content": "You are a helpful assistant. " * 4},
        {"role": "user", "content": QUESTION},
    ]
    prompt = build_tokenizer().apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>assistant\n")  # the template's tail
    (line,) = sample_lines([_sample(prompt)])
    shown = QUESTION.replace("\n", "\\n")  # a newline shown once escaped: backslash, n
    assert f'prompt "{shown}"' in line, line
    assert "\\\\n" not in line and "im_start" not in line and "helpful" not in line
    assert 'response "48 + 24 = 72.\\n#### 72"' in line and 'answer "72"' in line


def test_console_sample_of_a_plain_prompt_and_of_llama3():
    from rpeg.runtime.samples import sample_lines

    (plain,) = sample_lines([_sample("12+34=")])
    assert 'prompt "12+34="' in plain
    llama3 = (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        f"<|start_header_id|>user<|end_header_id|>\n\n{QUESTION}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    (line,) = sample_lines([_sample(llama3)])
    assert 'prompt "Natalia sold clips' in line and "Be brief" not in line
