"""The recipe columns a row's free text states (rpeg.perf.validation.row_text), and the shared-schema
copies of the shipped data sets scored as runs described only by the shared columns. Nothing
here reads ../shared: the copies are package data."""

import csv
from dataclasses import replace

import pytest

from rpeg.perf.validation import loso
from rpeg.perf.validation.loso_summary import summarise
from rpeg.perf.validation.row_text import read, system_of, with_text
from rpeg.perf.validation.rows import assumed_values, read_case
from rpeg.perf.validation.system_defaults import eager_default

#: the columns of ../shared/validation/steps_dev*.csv (its README's schema)
SHARED = [
    "case_id",
    "source",
    "source_locator",
    "measured_by",
    "algorithm",
    "model",
    "model_arch_notes",
    "gpu",
    "num_gpus",
    "gpus_per_node",
    "placement",
    "gen_gpus",
    "train_gpus",
    "gen_tp",
    "gen_pp",
    "gen_ep",
    "train_tp",
    "train_pp",
    "train_cp",
    "train_ep",
    "train_backend",
    "precision",
    "num_prompts",
    "samples_per_prompt",
    "train_minibatches",
    "avg_prompt_len",
    "avg_gen_len",
    "max_gen_len",
    "max_seq_len",
    "staleness",
    "partial_rollout",
    "has_ref",
    "has_critic",
    "measured_step_s",
    "measured_gen_s",
    "measured_train_s",
    "measured_other",
    "inferred_fields",
    "notes",
]


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_the_shared_copies_hold_the_shared_columns_and_the_shipped_cases():
    shipped = {r["case_id"] for p in loso.default_datasets().values() for r in _rows(p)}
    for path in loso.shared_copies().values():
        rows = _rows(path)
        assert list(rows[0]) == SHARED
        assert {r["case_id"] for r in rows} <= shipped and len(rows) >= 30


def _same(a: str, b: str) -> bool:
    a, b = a.strip().replace("~=", "="), b.strip().replace("~=", "=")  # "x~=19000" read as 19000
    try:
        return a == b or float(a) == float(b)
    except ValueError:
        return False


def test_the_shipped_rows_carry_the_shared_facts_unchanged():
    # the transcribed sets add columns and their own notes; every fact of the shared schema
    # (configuration, measured times) is the shared copy's, cell for cell
    shipped = {r["case_id"]: r for p in loso.default_datasets().values() for r in _rows(p)}
    words = {"notes", "model_arch_notes", "source_locator", "inferred_fields", "measured_by"}
    compared = 0
    for path in loso.shared_copies().values():
        for r in _rows(path):
            ref = shipped[r["case_id"]]
            for col in set(SHARED) - words:
                assert _same(r[col] or "", ref.get(col) or ""), (r["case_id"], col)
                compared += 1
    assert compared >= 2000


def test_what_the_text_states_agrees_with_every_transcribed_column():
    # the shipped sets' explicit columns were transcribed by hand from the same sources:
    # wherever a shared-schema copy's text states a column, it must say the same
    shipped = {r["case_id"]: r for p in loso.default_datasets().values() for r in _rows(p)}
    compared = 0
    for path in loso.shared_copies().values():
        for r in _rows(path):
            ref = shipped[r["case_id"]]
            for col, value in read(r).items():
                want = (ref.get(col) or "").strip().lower()
                if not want:
                    continue
                compared += 1
                if col == "gpu_memory_utilization":
                    assert float(value) == float(want), (r["case_id"], col)
                else:
                    assert value == want, (r["case_id"], col, value, want)
    assert compared >= 200  # system, packing, memory share, recompute, kind on most rows


def test_a_statement_that_is_conditional_or_contradicted_is_left_blank():
    assert read({"notes": "SGLang mem_fraction 0.8 (0.7 for >1B)"}) == {}
    assert read({"notes": "act_ckpt=True for the 8B; act_ckpt=False for the 32B"}) == {}
    got = read({"notes": "recipe: seq_packing=True, act_ckpt=False, vllm_gpu_mem_util=0.6"})
    assert got == {"seq_packing": "yes", "act_ckpt": "no", "gpu_memory_utilization": "0.6"}
    assert read({"model_arch_notes": "MoE 128e top-8 (Base checkpoint)"}) == {"model_kind": "base"}
    assert read({"notes": "a database of baseline runs"}) == {}


def test_a_cell_the_row_states_is_never_overridden():
    r = {"act_ckpt": "no", "notes": "act_ckpt=True, use_dynamic_bsz"}
    assert with_text(r) == {**r, "seq_packing": "yes"}


def test_the_system_is_the_family_of_the_backend_or_the_publisher_with_its_backend():
    assert system_of({"train_backend": "areal-realhf (megatron-style 3D)"}) == "areal"
    assert system_of({"source": "NeMo-RL summary", "train_backend": "megatron"}) == (
        "nemo-rl-megatron"
    )
    assert system_of({"source": "verl docs", "train_backend": "fsdp2"}) == "verl-fsdp"
    # a paper of one system timing another system: not unambiguous
    r = {"source": "AReaL paper", "train_backend": "fsdp", "notes": "run with verl code"}
    assert system_of(r) == ""
    assert system_of({"source": "a blog", "train_backend": "megatron"}) == ""


def test_a_base_checkpoint_in_the_text_takes_the_base_length_prior():
    path = loso.shared_copies()["steps_dev2 (shared schema)"]
    (row,) = [r for r in _rows(path) if r["case_id"] == "verl-fa-30b-async-96-32"]
    assert "base checkpoint" in row["model_arch_notes"].lower()
    assert read_case(row).workload.response_kind == "base"
    blank = {**row, "model_arch_notes": ""}
    assert read_case(blank).workload.response_kind != "base"


@pytest.mark.slow
def test_the_shared_schema_copies_score_within_five_points_of_the_transcribed_sets():
    scored, refused = loso.run()
    transcribed = {
        ds: summarise([s for s in scored + refused if s.dataset == ds])
        for ds in loso.default_datasets()
    }
    scored, refused = loso.run(loso.shared_copies())
    for ds, ref in transcribed.items():
        got = summarise([s for s in scored + refused if s.dataset == f"{ds} (shared schema)"])
        assert got.mape <= ref.mape + 5.0, (ds, got.mape, ref.mape)
        assert got.predicted_share >= 0.95 and got.coverage >= 0.8


def test_speculative_decoding_is_read_where_the_text_speaks_of_drafts():
    assert read({"model_arch_notes": "61L (MTP disabled)"}) == {"spec_decode": "none"}
    got = read({"notes": "SGLang rollout with MTP speculative decoding, num_speculative_tokens=2"})
    assert got == {"spec_decode": "mtp", "spec_draft_tokens": "2"}
    assert read({"notes": "EAGLE-3 draft head; acceptance length 2.6"}) == {
        "spec_decode": "eagle",
        "spec_accept_len": "2.6",
    }
    assert read({"notes": "the model was trained with an MTP loss"}) == {}
    # SGLang's spellings: NEXTN is its MTP; the draft depth is speculative_num_steps
    sg = read({"notes": "SGLang speculative_algorithm NEXTN, speculative_num_steps=3"})
    assert sg == {"spec_decode": "mtp", "spec_draft_tokens": "3"}
    tree = "speculative_algorithm=EAGLE speculative_num_steps=2 speculative_eagle_topk=2"
    assert read({"notes": tree}) == {
        "spec_decode": "eagle",
        "spec_draft_tokens": "2",
        "spec_topk": "2",
    }
    # a model's MTP heads drafted through SGLang's EAGLE worker (verl's and slime's MTP docs)
    # are MTP; the flags as slime passes them, with dashes; the tree's verified width
    mtp = (
        "MTP rollout: --sglang-speculative-algorithm EAGLE --sglang-speculative-num-steps 3 "
        "--sglang-speculative-eagle-topk 1 --sglang-speculative-num-draft-tokens 4"
    )
    assert read({"notes": mtp}) == {
        "spec_decode": "mtp",
        "spec_draft_tokens": "3",
        "spec_topk": "1",
        "spec_verify_tokens": "4",
    }
    # vLLM's flag right after the method's name (no word boundary inside num_speculative)
    assert read({"notes": "vLLM MTP num_speculative_tokens=1"}) == {
        "spec_decode": "mtp",
        "spec_draft_tokens": "1",
    }
    # NeMo-Aligner's critic server on nodes of its own
    said = "actor on 8 nodes, critic and reward model server on 4 nodes"
    assert read({"notes": said}) == {"critic_nodes": "4", "reward_model": "yes"}
    # one count for both, or none for the actor: not a pool of the critic's own
    assert read({"notes": "Llama3-70B PPO, actor and critic on 16 nodes"}) == {}
    assert read({"notes": "PPO, the critic on 4 nodes"}) == {}
    # the engine's cap on sequences in flight, as vLLM and SGLang name it
    assert read({"notes": "max_num_seqs=512"}) == {"gen_max_seqs": "512"}
    assert read({"notes": "--sglang-max-running-requests 128"}) == {"gen_max_seqs": "128"}


def test_the_checkpoint_kind_is_read_from_the_thinking_switch_and_named_checkpoints():
    assert read({"notes": "Qwen3-8B, enable_thinking=False"}) == {"model_kind": "instruct"}
    assert read({"notes": "Qwen3 in thinking mode enabled"}) == {"model_kind": "reasoning"}
    assert read({"model_arch_notes": "Instruct checkpoint"}) == {"model_kind": "instruct"}
    # two kinds named: not unambiguous
    assert read({"notes": "the base model and the instruct model are compared"}) == {}
    row = _described_kind("qwen3-8b", "non-thinking mode")
    assert read_case(row).workload.response_kind == "instruct"


def _described_kind(model, notes):
    path = loso.shared_copies()["steps_dev (shared schema)"]
    row = _rows(path)[0]
    return {**row, "model": model, "notes": notes, "model_arch_notes": ""}


def test_the_batch_is_read_where_a_recipe_names_it():
    verl = "data.train_batch_size=256 actor_rollout_ref.rollout.n=8 ppo_mini_batch_size=64"
    assert read({"notes": verl}) == {"num_prompts": "256", "samples_per_prompt": "8"}
    nemo = "num_prompts_per_step: 64, num_generations_per_prompt: 32"
    assert {k: read({"notes": nemo})[k] for k in ("num_prompts", "samples_per_prompt")} == {
        "num_prompts": "64",
        "samples_per_prompt": "32",
    }
    got = read({"notes": "--rollout-batch-size 32 --n-samples-per-prompt 8"})
    assert got == {"num_prompts": "32", "samples_per_prompt": "8"}
    assert read({"notes": "GRPOConfig(num_generations=16)"}) == {"samples_per_prompt": "16"}
    # a bare train_batch_size counts samples per optimizer step in DeepSpeed and OpenRLHF
    assert read({"notes": "train_batch_size=1024, micro_train_batch_size=4"}) == {}
    # two statements that disagree leave it blank
    assert "num_prompts" not in read({"notes": "rollout_batch_size=32; rollout_batch_size=64"})


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("dynamic_bsz (ppo_max_token_len_per_gpu=2x(prompt+resp)), remove_padding", "2x"),
        ("actor.ppo_max_token_len_per_gpu=16384", "16384"),
        ("dynamic bsz (max 10240 tok/GPU), vLLM gen TP4", "10240"),
        ("dynamic micro-batching with 32,768-token budget", "32768"),
        ("ppo_max_token_len_per_gpu=2x(prompt+resp); ppo_max_token_len_per_gpu=16384", None),
        ("micro_batch_size 4", None),  # a count of rows names no token budget
    ],
)
def test_the_micro_batch_token_budget_is_read_where_a_recipe_states_it(text, value):
    assert read({"notes": text}).get("micro_batch_tokens") == value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("vLLM gen TP4 enforce_eager, gpu_memory_utilization 0.7", "yes"),
        ("actor_rollout_ref.rollout.enforce_eager=False", "no"),
        ("rollout.enforce_eager: true", "yes"),
        ("SGLang with disable_cuda_graph", "yes"),
        ("sglang disable_cuda_graph=false", None),
        ("CUDA graphs disabled for the engine", "yes"),
        ("enforce_eager=True; enforce_eager=False", None),  # two statements that disagree
        ("vLLM 0.8.4 with CUDA graphs", None),
    ],
)
def test_an_eager_engine_is_read_where_the_text_names_it(text, value):
    assert read({"notes": text}).get("enforce_eager") == value


def test_a_row_whose_engine_runs_eager_prices_its_decode_without_cuda_graphs():
    path = loso.shared_copies()["steps_dev (shared schema)"]
    row = {**_rows(path)[0], "notes": "vLLM gen TP4 enforce_eager"}
    case = read_case(row)
    assert case.enforce_eager
    lay = case.layout
    filled = replace(
        lay,
        gen_tp=lay.gen_tp or 1,
        train_tp=lay.train_tp or 1,
        gpu_memory_utilization=lay.gpu_memory_utilization or 0.6,
    )
    gen = [u for u in case.plan(filled).units.values() if u.engine == "vllm"]
    assert gen and all(u.enforce_eager for u in gen)
    assert not read_case({**row, "notes": ""}).enforce_eager


@pytest.mark.parametrize(
    ("system", "text", "eager"),
    [
        ("verl-fsdp", "verl 0.3.0.post1, vLLM rollout", True),
        ("verl-megatron", "trained with verl v0.5.0", True),
        ("verl-fsdp", "pip install verl==0.4.1", True),
        ("verl-fsdp", "verl v0.6.1, vLLM rollout", False),  # CUDA graphs on by default
        ("verl-fsdp", "verl 0.3.0.post1, SGLang 0.4.5.post3 rollout", False),
        ("verl-fsdp", "verl v0.4.1 then verl v0.7.0", False),  # releases that disagree
        ("verl-fsdp", "verl main", False),  # no release named
        ("nemo-rl-megatron", "compared with verl 0.4.1", False),  # not a verl run
    ],
)
def test_a_verl_release_before_cuda_graphs_by_default_runs_its_rollout_eager(system, text, eager):
    assert eager_default(system, {"notes": text}) is eager


def test_the_release_default_yields_to_a_stated_flag_and_is_reported_as_assumed():
    path = loso.shared_copies()["steps_dev (shared schema)"]
    row = {**_rows(path)[0], "system": "verl-fsdp", "notes": "verl 0.4.1, vLLM rollout"}
    case = read_case(row)
    assert case.enforce_eager and "enforce_eager" in case.unknown
    assert "enforce_eager=yes (verl <= 0.5 rollout default)" in assumed_values(case)
    stated = read_case({**row, "notes": "verl 0.4.1, vLLM rollout, enforce_eager=False"})
    assert not stated.enforce_eager and "enforce_eager" not in stated.unknown
