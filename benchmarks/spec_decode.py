"""Speculative decoding in the rollout engine against the published rollout gains: what the
model prices for a rollout with drafts over the same rollout without, beside what the
publisher measured.

- NVIDIA's speculative NeMo-RL rollouts (arXiv 2604.26779): Qwen3-8B GRPO on 32 GB200, an
  EAGLE-3 chain of k = 3 / 5 / 7 drafts, 64 x 16 samples, 8,192-token cap; rollout speedups
  1.77 / 1.44 / 1.21x (RL-Zero; RL-Think's lower acceptance gave 1.53 / 0.84 / 0.71x).
- verl's MTP guide (docs/advance/mtp.md, 2026-01): MiMo-7B on H20 with SGLang drafting through
  the MTP head (2 steps x 2 candidates, 4 tokens verified): "the Rollout throughput decreases
  by approximately 50%" (a gain of ~0.5x; batch and GPUs unstated: verl's example, 128 x 16,
  8,192-token cap, on 8 rollout GPUs at TP 1 is priced).
- The same MTP rollout driven by slime (SGLang's 48 running requests under speculative
  decoding: no published gain; printed for the cap's size).

Each row is a shared-schema row as a user writes it; the acceptance is the prior's
(``Calibration.spec_accept_rate``) where the publisher gives none. Prints a line per case and
a summary line (mean |log(priced / measured)| over the measured cases).
``python benchmarks/spec_decode.py`` (~5 s). docs/perf-model.md, "Equations".
"""

from __future__ import annotations

import math

from user_file import blank_row

from rpeg.perf.calibration import SHIPPED
from rpeg.perf.validation.rows import read_case
from rpeg.perf.validation.solve import solve_row

_TREE = (
    "SGLang rollout, MTP: speculative_algorithm=EAGLE speculative_num_steps=2 "
    "speculative_eagle_topk=2 speculative_num_draft_tokens=4"
)
_QWEN = dict(
    model="Qwen3-8B-Base", gpu="GB200", num_gpus="32", gpus_per_node="4", gen_tp="1",
    train_backend="nemo-rl megatron", num_prompts="64", samples_per_prompt="16",
    max_gen_len="8192",
)  # fmt: skip
_MIMO = dict(
    model="mimo-7b", gpu="h20", num_gpus="16", gpus_per_node="8", placement="disaggregated",
    gen_gpus="8", train_gpus="8", gen_tp="1", num_prompts="128", samples_per_prompt="16",
    max_gen_len="8192", staleness="0",
)  # fmt: skip

#: (case, base cells, notes of the plain rollout, notes with drafts, measured gain or None)
CASES = (
    ("nemo-rl qwen3-8b eagle-3 k=3", _QWEN, "vLLM", "vLLM EAGLE-3 num_speculative_tokens=3", 1.77),
    ("nemo-rl qwen3-8b eagle-3 k=5", _QWEN, "vLLM", "vLLM EAGLE-3 num_speculative_tokens=5", 1.44),
    ("nemo-rl qwen3-8b eagle-3 k=7", _QWEN, "vLLM", "vLLM EAGLE-3 num_speculative_tokens=7", 1.21),
    ("verl mimo-7b mtp tree, h20", {**_MIMO, "train_backend": "verl megatron"}, "SGLang", _TREE, 0.5),
    ("verl mimo-7b mtp tree, h800", {**_MIMO, "gpu": "h800", "train_backend": "verl megatron"}, "SGLang", _TREE, None),
    ("slime mimo-7b mtp tree, h800", {**_MIMO, "gpu": "h800", "train_backend": "slime"}, "SGLang", _TREE, None),
)  # fmt: skip


def rollout_s(cells: dict[str, str], notes: str) -> tuple[float, object]:
    """The priced rollout stage of the row ``cells`` with ``notes``, and its workload."""
    row = blank_row(
        case_id="spec", source="spec_decode benchmark", algorithm="grpo", notes=notes, **cells
    )
    case, _, pred = solve_row(read_case(row), SHIPPED)
    return pred.stages["generate"].time_s, case.workload


def main() -> None:
    errs = []
    for name, cells, plain_notes, spec_notes, measured in CASES:
        plain, _ = rollout_s(cells, plain_notes)
        spec, wl = rollout_s(cells, spec_notes)
        gain = plain / spec
        shown = "-" if measured is None else f"{measured:.2f}x"
        print(
            f"{name:30s} rollout {plain:7.1f} -> {spec:7.1f} s  priced {gain:.2f}x  measured {shown:>6s}"
            f"  (k={wl.spec_draft_tokens} topk={wl.spec_topk} verify={wl.spec_verify_tokens or 1 + wl.spec_draft_tokens}"
            f" running cap={wl.gen_max_seqs or SHIPPED.max_num_seqs})"
        )
        if measured is not None:
            errs.append(abs(math.log(gain / measured)))
    mean = sum(errs) / len(errs)
    print(
        f"SUMMARY cases={len(errs)} mean |log(priced/measured)|={mean:.2f} (a factor {math.exp(mean):.2f})"
    )


if __name__ == "__main__":
    main()
