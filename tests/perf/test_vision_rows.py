"""A vision-language row's prompt (issue 43 item 2): a published prompt length already counts
the images' LM tokens (the processor expands each image placeholder before the engine and
the trainer see the prompt), so the images are carved out of it for the tower's cost and the
LM prompt keeps its published length; unpublished, the text prior plus the model's image
prior."""

import pytest

from rpeg import specs
from rpeg.perf.pricing import predict
from rpeg.perf.validation.rows import PRIORS, assumed_values, read_case, row_case
from tests.perf.schema_rows import schema_row


def _row(**cells):
    return schema_row(dict(
        case_id="vl", source="synthetic", measured_step_s="100", gpus_per_node="8",
        model="Qwen/Qwen2.5-VL-7B-Instruct", gpu="H100", num_gpus="8", placement="colocated",
        algorithm="grpo", has_critic="no", has_ref="yes", num_prompts="512",
        samples_per_prompt="5", max_gen_len="2048", avg_gen_len="300", train_backend="fsdp",
        train_minibatches="4",
    ), **cells)  # fmt: skip


def test_a_published_prompt_of_a_vision_model_counts_its_images():
    prior = specs.model("qwen2.5-vl-7b-instruct").vision.image_tokens
    assert prior == round(512 * 512 / 28**2)  # one image at the RL frameworks' pixel floor
    case = read_case(_row(avg_prompt_len="400"))
    wl = case.workload
    # 400 tokens published: 150 of text (the prior), 250 of images
    assert wl.image_tokens == pytest.approx(400 - PRIORS["avg_prompt_len"])
    assert wl.mean_prompt_tokens + wl.image_tokens == pytest.approx(400)
    assert "image_tokens=250" in assumed_values(case)
    # a long prompt: the images take at most the model's prior
    long = read_case(_row(avg_prompt_len="5000")).workload
    assert long.image_tokens == prior and long.mean_prompt_tokens == 5000 - prior
    # stated image tokens are taken as stated, the prompt as published plus them
    stated = read_case(_row(avg_prompt_len="600", image_tokens="256")).workload
    assert (stated.image_tokens, stated.mean_prompt_tokens) == (256, 600)


def test_an_unpublished_prompt_takes_the_text_prior_and_the_image_prior():
    wl = read_case(_row()).workload
    assert wl.image_tokens is None and wl.mean_prompt_tokens == PRIORS["avg_prompt_len"]
    # Qwen3-VL's LM token covers 32 pixels a side (16-pixel patches merged 2x2)
    assert specs.model("qwen3-vl-8b-instruct").vision.image_tokens == 512 * 512 // 32**2


def test_the_tower_runs_over_the_images_a_published_prompt_holds():
    # the same published prompt: with fewer image tokens carved out, less tower work; the
    # LM sees the same prompt either way, so only the tower's FLOPs differ
    graph, plan, wl = row_case(_row(avg_prompt_len="400"))
    carved = predict(graph, plan, wl)
    graph, plan, wl0 = row_case(_row(avg_prompt_len="400", image_tokens="0"))
    no_images = predict(graph, plan, wl0)
    graph, plan, wl1 = row_case(_row(avg_prompt_len="150", image_tokens="250"))
    same = predict(graph, plan, wl1)
    assert no_images.step_s < carved.step_s
    assert same.step_s == pytest.approx(carved.step_s, rel=1e-9)
