"""Issue 44, item 5: hostile inputs fuzzed with a bounded budget (a few seconds in all).

Over configs (CLI overrides and YAML text), data rows, calculator expressions and CSV rows of
``rpeg validate``: every input ends in success or a named refusal (exit 0 or 2; a
ConfigError / CalcError / Unpredictable naming the field or the file), within a time and a
memory bound -- never a stray exception, a hang or a blown-up allocation."""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rpeg.errors import ConfigError, ProblemsError

FAST = settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,  # the same examples on every run: CI never meets a new one by chance
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
#: each example's bounds (a hang or an expansion takes minutes; a loaded 2-core machine
#: takes a second or two for the slowest honest example)
MAX_S = 5.0
MAX_BYTES = 64 * 2**20


class _Bounded:
    """Time and peak Python allocation of the block, checked at its end."""

    def __enter__(self):
        tracemalloc.start()
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        took = time.monotonic() - self.t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert took < MAX_S, f"took {took:.1f} s"
        assert peak < MAX_BYTES, f"allocated {peak} bytes"
        return False


# --- configs ------------------------------------------------------------------------------
FIELDS = [
    "workload.num_prompts",
    "workload.samples_per_prompt",
    "workload.max_prompt_tokens",
    "workload.max_response_tokens",
    "workload.train_minibatches",
    "workload.temperature",
    "optim.lr",
    "optim.grad_clip",
    "runtime.seed",
    "runtime.steps",
    "runtime.max_staleness",
    "task.system_prompt",
    "task.overlong",
    "algorithm.name",
    "cluster.num_devices",
    "no.such_field",
]
SCALARS = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=300),
    st.sampled_from(["", "null", "[1, 2]", "{a: 1}", "&a [*a]", "1e400", "-0", "true"]),
)


def _quiet_main(args, err):
    import contextlib
    import io

    from rpeg.cli import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        return main(args)


@pytest.fixture(scope="module")
def warm_cli():
    """The CLI's imports, once, outside the per-example bounds."""
    import io

    assert _quiet_main(["config", "show"], io.StringIO()) == 0


@settings(FAST, max_examples=20)  # ~0.2 s each: a whole `rpeg config show`
@example(items=[("task.system_prompt", "You are careful. " * 20)])  # > 255 bytes
@example(items=[("runtime.seed", 2**70), ("optim.lr", 1e30)])
@given(items=st.lists(st.tuples(st.sampled_from(FIELDS), SCALARS), max_size=4))
def test_cli_overrides_end_in_exit_0_or_2_naming_the_field(warm_cli, items):
    import io

    args = [f"{k}={v}" for k, v in items]
    err = io.StringIO()
    with _Bounded():
        code = _quiet_main(["config", "show", *args], err)
    assert code in (0, 2), (args, err.getvalue()[-500:])
    text = err.getvalue()
    if code == 2:
        assert "error" in text and "Traceback" not in text
    for k, v in items:  # values that can only fail after start are refused by name now
        if (k == "runtime.seed" and isinstance(v, int) and not 0 <= v < 2**32) or (
            k == "optim.lr" and isinstance(v, float) and v > 10
        ):
            # refused; named when nothing else was (an unreadable override beside it stops
            # the reading first, and names itself)
            assert code == 2 and (k in text or len(items) > 1)


YAML_TOKENS = st.sampled_from(
    ["a:", " ", "\n", "  ", "- ", "&x", "*x", "[", "]", "{", "}", ",", "1", "runtime:",
     "steps: 3", "workload:", "num_prompts: -1", "!!python/object:os.system", "'", '"', "#"]
)  # fmt: skip


@FAST
@given(st.lists(YAML_TOKENS, max_size=40).map("".join))
def test_yaml_text_loads_or_is_a_named_config_error(text):
    from rpeg.config import RunConfig

    with _Bounded():
        try:
            RunConfig.from_yaml(text + "\n")
        except ConfigError as exc:
            assert exc.problems


@FAST
@example(levels=9, width=10)  # 90 aliases, under the alias limit: 10**9 nodes expanded
@given(levels=st.integers(min_value=2, max_value=12), width=st.integers(min_value=2, max_value=12))
def test_alias_bombs_in_a_config_are_refused_quickly(levels, width):
    from rpeg.config import RunConfig
    from rpeg.config.yaml_io import MAX_YAML_NODES

    lines = ["plan:", "  a0: &a0 [x]"] + [
        f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels + 1)
    ]
    with _Bounded():
        try:
            RunConfig.from_yaml("\n".join(lines) + "\n").with_overrides({"runtime.steps": 2})
        except ConfigError as exc:
            assert exc.problems
        else:  # what expands past the node limit is never accepted
            assert width**levels <= MAX_YAML_NODES, "a plan of aliases was accepted"


# --- data rows ----------------------------------------------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4)
    ),
    max_leaves=12,
)
ROWS = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {"question": JSON, "answer": JSON}, optional={"prompt": JSON, "solution": JSON}
    ),
)


@FAST
@example(rows=[{"question": None, "answer": "1"}])
@example(rows=[{"question": None, "answer": [], "prompt": []}])
@given(rows=st.lists(ROWS, min_size=1, max_size=6))
def test_data_rows_are_examples_or_problems_naming_the_line(tmp_path_factory, rows):
    from rpeg.runtime.datasets.files import check_examples

    path = tmp_path_factory.mktemp("rows") / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with _Bounded():
        problems = check_examples(str(path), "jsonl")
    for p in problems:
        assert p.where.startswith(str(path)) or p.where == "task.url"
        assert p.what
    from rpeg.runtime.datasets.files import DEFAULT_PROMPT_KEYS

    for i, r in enumerate(rows, start=1):  # a null prompt is named as null, on its line
        if not isinstance(r, dict) or r.get("question", "") is not None:
            continue
        # a null 'question' beside another prompt column ('prompt' holding messages) is
        # read from that column, whose own problem (if any) names the line
        others = [r[k] for k in DEFAULT_PROMPT_KEYS if k in r and k != "question"]
        if all(v is None for v in others):
            assert any(p.where == f"{path}:{i}" and "null" in p.what for p in problems)
        else:
            assert not problems or all(p.where.startswith(str(path)) for p in problems)


# --- calculator expressions ---------------------------------------------------------------
CALC = st.lists(
    st.sampled_from(list("0123456789+-*/().") + ["**", "**8", "1/7", "(", ")", " ", "9" * 15]),
    max_size=30,
).map("".join)


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@example(text="((((((((1/7)**8)**8)**8)**8)**8)**8)**8)**8")  # 43 characters: minutes before
@given(text=CALC)
def test_calculator_expressions_end_in_a_value_or_a_refusal_quickly(text):
    from rpeg.runtime.envs.calculator import CalcError, calc

    with _Bounded():
        try:
            out = calc(text)
        except CalcError as exc:
            assert str(exc)
        else:
            assert isinstance(out, str) and len(out) < 64


# --- CSV rows of rpeg validate ------------------------------------------------------------
CSV_COLUMNS = [
    "algorithm", "model", "gpu", "num_gpus", "gpus_per_node", "placement", "gen_tp",
    "train_tp", "precision", "num_prompts", "samples_per_prompt", "train_minibatches",
    "avg_prompt_len", "avg_gen_len", "max_gen_len", "max_seq_len", "staleness",
    "measured_step_s",
]  # fmt: skip
CELL = st.one_of(
    st.sampled_from(["", "8", "-5", "0", "1e9", "nan", "inf", "yes", "grpo", "H100", "x"]),
    st.text(max_size=12),
)
BASE = {
    "case_id": "fuzz",
    "source": "fuzz",
    "algorithm": "grpo",
    "model": "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
    "gpu": "H100",
    "num_gpus": "16",
    "gpus_per_node": "8",
    "num_prompts": "32",
    "samples_per_prompt": "8",
    "measured_step_s": "300",
}


LENGTHS = ("avg_prompt_len", "avg_gen_len", "max_gen_len", "max_seq_len")


@FAST
@example(cells={"avg_gen_len": "-5"})
@given(cells=st.dictionaries(st.sampled_from(CSV_COLUMNS), CELL, max_size=5))
def test_csv_rows_are_read_or_refused_naming_the_column(cells):
    from rpeg.perf.validation.row_cells import Unpredictable
    from rpeg.perf.validation.rows import read_case

    refused = None
    with _Bounded():
        try:
            read_case({**BASE, **cells})
        except (Unpredictable, ProblemsError) as exc:  # ProblemsError: a named SpecError too
            refused = str(exc)
            assert refused
    for col in LENGTHS:  # a negative length is never replaced by a prior silently
        if _negative(cells.get(col, "")):
            assert refused is not None


def _negative(cell: str) -> bool:
    try:
        return float(cell.split()[0]) < 0 if cell.strip() else False
    except ValueError:
        return False
