import pytest

from tests.firstday.tiny_hf import build_tiny_qwen, write_trl_jsonl, write_verl_parquet


@pytest.fixture(scope="session")
def user_files(tmp_path_factory):
    """A user's model folder (tiny Qwen2 with a chat template), verl Parquet, TRL JSONL."""
    d = tmp_path_factory.mktemp("user")
    return {
        "model": str(build_tiny_qwen(d / "model")),
        "verl": str(write_verl_parquet(d / "gsm8k_train.parquet")),
        "trl": str(write_trl_jsonl(d / "trl_train.jsonl")),
    }


def run_yaml(user_files, out, data="verl", **extra) -> str:
    """A run config for the user's model and data (verl: task.prompt_key prompt,
    task.answer_key reward_model.ground_truth)."""
    import yaml

    task = {"kind": "parquet", "url": user_files["verl"], "prompt_key": "prompt"}
    task["answer_key"] = "reward_model.ground_truth"
    if data == "trl":
        task = {"kind": "jsonl", "url": user_files["trl"], "prompt_key": "prompt"}
    task["heldout_size"] = 4
    cfg = {
        "model": {"path": user_files["model"]},
        "task": task,
        "workload": {
            "num_prompts": 2,
            "samples_per_prompt": 2,
            "max_response_tokens": 6,
            "train_minibatches": 1,
        },
        "algorithm": {"entropy_coef": 0.05},  # rewards of a random model are all 0: move it
        "runtime": {
            "output_dir": str(out / "out"),
            "checkpoint_url": str(out / "ckpt"),
            "checkpoint_every": 3,
        },
    }
    for k, v in extra.items():
        cfg.setdefault(k, {}).update(v)
    path = out / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)
