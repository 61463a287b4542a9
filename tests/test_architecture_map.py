"""docs/architecture.md's module map matches the tree (issue 37): every package and every
folder of modules under rpeg/ (and flows/, tasks/, infra/, installed as rpeg.flows, rpeg.tasks,
rpeg.infra) is named in it, as a row of its own (``rpeg.runtime.step``) or as ``name/`` in its
parent's row; every row names an existing package, and every module a row names outside
parentheses exists there (a moved or deleted module leaves the map with it).

``python tests/test_architecture_map.py`` also lists the modules no row names yet (a report:
the map names the ones a newcomer needs, not necessarily all).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
#: folder -> the package it installs as (setup.py maps the three top-level folders)
TOPS = {"rpeg": "rpeg", "flows": "rpeg.flows", "tasks": "rpeg.tasks", "infra": "rpeg.infra"}


def module_folders() -> dict[str, Path]:
    """Dotted name -> folder, for every folder holding Python modules (a package or not)."""
    out: dict[str, Path] = {}
    for top, dotted in TOPS.items():
        for d in sorted({f.parent for f in (ROOT / top).rglob("*.py")}):
            if "__pycache__" in d.parts:
                continue
            rel = d.relative_to(ROOT / top).parts
            out[".".join([dotted, *rel])] = d
    return out


def _module_file(dotted: str) -> Path:
    """``rpeg.defaults`` -> rpeg/defaults.py (a row may name a module, not a package)."""
    parts = dotted.split(".")
    top = next(t for t, d in TOPS.items() if d == ".".join(parts[: len(d.split("."))]))
    rest = parts[len(TOPS[top].split(".")) :]
    return ROOT.joinpath(top, *rest).with_suffix(".py")


def _without_parentheses(text: str) -> str:
    while True:
        shorter = re.sub(r"\([^()]*\)", "", text)
        if shorter == text:
            return text
        text = shorter


def map_rows() -> dict[str, str]:
    """Package -> the modules cell of its row in the "Module map" table."""
    text = DOC.read_text().split("## Module map", 1)[1]
    rows: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"\|\s*`(rpeg(?:\.[a-z_0-9]+)*)`\s*\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def named_in_map(rows: dict[str, str]) -> set[str]:
    """Every package the map names: its rows, and ``name/`` entries in a row."""
    named = set(rows)
    for pkg, cell in rows.items():
        named |= {f"{pkg}.{n}" for n in re.findall(r"`([a-z_0-9]+)/`", cell)}
    return named


def test_every_folder_of_modules_is_named_in_the_module_map():
    named = named_in_map(map_rows())
    missing = sorted(set(module_folders()) - named - {"rpeg"})
    assert missing == [], f"docs/architecture.md 'Module map' does not name {missing}"


def test_the_module_map_names_only_what_exists():
    folders = module_folders()
    rows = map_rows()
    stale = [pkg for pkg in rows if pkg not in folders and not _module_file(pkg).is_file()]
    for pkg, cell in rows.items():
        if pkg not in folders:
            continue
        for name in re.findall(r"`([a-z_][a-z_0-9]*)/?`", _without_parentheses(cell)):
            d = folders[pkg]
            if not ((d / f"{name}.py").is_file() or (d / name).is_dir()):
                stale.append(f"{pkg}.{name}")
    assert stale == [], f"docs/architecture.md 'Module map' names what is not there: {stale}"


def test_the_map_parser_reads_rows_subfolders_and_skips_parentheses():
    cell = " `a` (`not_a_module`, `x`), `sub/` (`inner`), `b` + `c` "
    rows = {"rpeg.pkg": cell}
    assert named_in_map(rows) == {"rpeg.pkg", "rpeg.pkg.sub"}
    kept = re.findall(r"`([a-z_][a-z_0-9]*)/?`", _without_parentheses(cell))
    assert kept == ["a", "sub", "b", "c"]


def unnamed_modules() -> list[str]:
    """Modules of a mapped package that its row does not name (the report)."""
    folders, rows = module_folders(), map_rows()
    out = []
    for pkg, cell in rows.items():
        d = folders.get(pkg)
        if d is None:
            continue
        names = set(re.findall(r"`([a-z_][a-z_0-9]*)", cell))
        out += [
            f"{pkg}.{f.stem}"
            for f in sorted(d.glob("*.py"))
            if f.stem not in names and f.stem != "__init__"
        ]
    return out


if __name__ == "__main__":
    for name in unnamed_modules():
        print(f"not in the module map: {name}")
