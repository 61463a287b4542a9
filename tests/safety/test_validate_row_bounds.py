"""Issue 44, item 9: ``rpeg validate`` refuses a row with a negative measured length, naming
the column, instead of replacing it by the prior silently."""

from __future__ import annotations

import pytest

from rpeg.perf.validation.row_cells import Unpredictable
from rpeg.perf.validation.rows import read_case

ROW = {
    "case_id": "neg-1",
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


@pytest.mark.parametrize("col", ["avg_gen_len", "avg_prompt_len", "max_seq_len"])
def test_a_negative_length_refuses_its_row_naming_the_column(col):
    with pytest.raises(Unpredictable, match=f"{col}=-500: must be >= 0"):
        read_case({**ROW, col: "-500"})


def test_a_blank_length_still_takes_the_prior():
    assert read_case({**ROW, "avg_gen_len": ""}) is not None
