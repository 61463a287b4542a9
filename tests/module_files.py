"""The package's modules as files: rpeg/ and the folders installed as rpeg.flows, rpeg.tasks
and rpeg.infra (the import-structure tests read them: tests/test_layers.py,
tests/test_private_access.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {"flows": "flows", "tasks": "tasks", "infra": "infra"}  # rpeg.<key> -> folder


def rpeg_module_files() -> dict[str, Path]:
    """Dotted name -> file, for rpeg/ and the mapped folders, in path order."""
    out: dict[str, Path] = {}
    roots = {"rpeg": ROOT / "rpeg", **{f"rpeg.{k}": ROOT / v for k, v in MAPPED.items()}}
    for prefix, root in roots.items():
        for f in sorted(root.rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if prefix == "rpeg" and parts and parts[0] in MAPPED:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([prefix, *parts])] = f
    return out
