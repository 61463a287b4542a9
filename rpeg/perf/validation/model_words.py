"""The words of a model's name as published runs write it (pure): the catalog key it is
matched by, its compact form, the checkpoint suffixes that say what it emits, the vendor
words some names lead with. Read by :mod:`.row_cells` (which catalog entry a name is) and
:mod:`.stand_in` (the architecture a size-only name gets)."""

from __future__ import annotations

import re


def catalog_key(name: str) -> str:
    """Catalog key of a name as written: no organisation prefix, lower case, dashes, no
    footnote marks around it (``Qwen2.5-7B*``, ``Llama-3-8B†``)."""
    n = (name or "").strip().split("/")[-1].lower()
    n = "-".join(n.replace("_", " ").split())
    return n.strip("*†‡§¶#^'\"`,;:.")


def compact_name(name: str) -> str:
    return re.sub(r"[-_.\s]", "", name)


# checkpoint suffixes of one architecture -> what the checkpoint was trained to emit
SUFFIX_KIND = {
    "base": "base",
    "instruct": "instruct",
    "chat": "instruct",
    "it": "instruct",
    "thinking": "reasoning",
}


#: vendor words that lead some checkpoint names (Meta-Llama-3-8B, NVIDIA-Nemotron-3-Nano-30B-A3B)
VENDORS = ("meta-", "nvidia-")
