"""Catalog entries of another entry's architecture (``same_as``: fine-tunes and RL checkpoints
published under their own names) and how published model names reach them."""

from __future__ import annotations

import pytest

from rpeg import specs
from rpeg.perf.validation.row_cells import resolve_model
from rpeg.specs._load import SpecError
from rpeg.specs.models import parse_models

ARCH = ("layers", "hidden", "ffn_hidden", "heads", "kv_heads", "head_dim", "vocab")


def test_a_derived_entry_takes_the_architecture_and_keeps_its_own_kind():
    base = {"layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 2}
    base |= {"head_dim": 16, "vocab": 100, "kind": "instruct", "published_params_b": 0.1}
    out = parse_models(
        [
            (
                {
                    "models": {
                        "rl-run": {"same_as": "m", "kind": "reasoning", "source": "card"},
                        "m": base,  # defined after its derivative: order does not matter
                        "plain": {"same_as": "m"},
                    }
                },
                "test",
            )
        ]
    )
    for name in ("rl-run", "plain"):
        assert [getattr(out[name], a) for a in ARCH] == [getattr(out["m"], a) for a in ARCH]
        assert out[name].params == out["m"].params and out[name].name == name
        assert out[name].published_params_b is None  # the base's headline is not this one's
    assert (out["rl-run"].kind, out["plain"].kind) == ("reasoning", "instruct")
    assert out["rl-run"].source == "card" and out["plain"].source == "same architecture as m"


@pytest.mark.parametrize(
    "entry,said",
    [
        ({"same_as": "nowhere"}, "models.x.same_as"),
        ({"same_as": "m", "layers": 4}, "layers"),  # architecture beside same_as: unknown key
        ({"same_as": "m", "kind": "chatty"}, "kind"),
    ],
)
def test_a_bad_derived_entry_is_refused_naming_the_field(entry, said):
    base = {"layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 2}
    base |= {"head_dim": 16, "vocab": 100}
    with pytest.raises(SpecError, match=said):
        parse_models([({"models": {"m": base, "x": entry}}, "test")])


@pytest.mark.parametrize(
    "published,entry,kind",
    [
        ("agentica-org/DeepScaleR-1.5B-Preview", "deepseek-r1-distill-qwen-1.5b", "reasoning"),
        ("Skywork/Skywork-OR1-7B-Preview", "deepseek-r1-distill-qwen-7b", "reasoning"),
        ("Qwen/Qwen2.5-Coder-7B-Instruct", "qwen2.5-7b", "instruct"),
        ("Qwen/Qwen2-72B-Instruct", "qwen2.5-72b-instruct", "instruct"),
        ("nvidia/Llama-3.1-Nemotron-Nano-8B-v1", "llama3.1-8b", "reasoning"),
    ],
)
def test_published_checkpoint_names_price_as_their_architecture(published, entry, kind):
    name, said = resolve_model(published)
    m, arch = specs.model(name), specs.model(entry)
    assert name != entry and m.params == arch.params
    assert (said or m.kind) == kind


def test_the_last_file_s_entry_of_a_name_wins():
    base = {"layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 2}
    base |= {"head_dim": 16, "vocab": 100}
    shipped = {"models": {"m": base, "x": {"same_as": "m"}, "y": base}}
    user = {"models": {"x": {**base, "layers": 3}, "y": {"same_as": "m", "kind": "base"}}}
    out = parse_models([(shipped, "rpeg/specs/data/models.yaml"), (user, "user")])
    assert out["x"].layers == 3  # a user's full entry over a shipped same_as
    assert out["y"].kind == "base" and out["y"].source == "same architecture as m"
