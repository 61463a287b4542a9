"""The package's layering (docs/architecture.md): no import cycle inside rpeg, the layers
contract of pyproject.toml holds for the whole tree (including flows/, tasks/ and infra/,
which install as rpeg.flows, rpeg.tasks and rpeg.infra), and every name is imported from the
module that defines it (re-exports only in a package's ``__init__``).

grimp (installed with import-linter) builds the import graph. It finds a package's modules
by walking its folder, so it cannot see the three mapped folders under rpeg/; the tests stage
a copy of the tree made of symlinks (rpeg/* plus rpeg/flows -> flows, ...) and build the
graph there, in a subprocess so that the imported rpeg of this process does not interfere.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from tests.module_files import MAPPED, ROOT, rpeg_module_files

_GRAPH_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import grimp
    import networkx as nx

    package, layers = sys.argv[1], json.loads(sys.argv[2])
    g = grimp.build_graph(package, cache_dir=None)
    d = nx.DiGraph()
    for m in g.modules:
        d.add_node(m)
        for i in g.find_modules_directly_imported_by(m):
            d.add_edge(m, i)
    cycles = [sorted(c) for c in nx.strongly_connected_components(d) if len(c) > 1]
    present = [
        grimp.Layer(*[t for t in layer if t in g.modules], independent=True)
        for layer in layers
        if any(t in g.modules for t in layer)
    ]
    illegal = sorted(
        f"{dep.importer} -> {dep.imported}"
        for dep in g.find_illegal_dependencies_for_layers(present)
    )
    print(json.dumps({"modules": sorted(g.modules), "cycles": cycles, "illegal": illegal}))
    """
)


def _contract_layers() -> list[list[str]]:
    """The layers contract of pyproject.toml, high to low; each layer a list of modules."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in conf["contracts"] if c["type"] == "layers"]
    out = []
    for raw in contract["layers"]:
        assert ":" not in raw, "the test reads independent layers ('|') only"
        out.append([t.strip().strip("()") for t in raw.split("|")])
    return out


def _stage(tmp: Path) -> Path:
    """A tree whose rpeg/ holds rpeg/* and the mapped folders, as symlinks."""
    pkg = tmp / "rpeg"
    pkg.mkdir()
    for entry in (ROOT / "rpeg").iterdir():
        if entry.name not in MAPPED and entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for name, folder in MAPPED.items():
        (pkg / name).symlink_to(ROOT / folder)
    return tmp


def _graph(path: Path, package: str, layers: list[list[str]]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(path)}
    out = subprocess.run(
        [sys.executable, "-c", _GRAPH_SCRIPT, package, json.dumps(layers)],
        cwd=path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> dict:
    return _graph(_stage(tmp_path_factory.mktemp("stage")), "rpeg", _contract_layers())


def test_the_staged_graph_sees_the_whole_tree(tree):
    mods = set(tree["modules"])
    for m in ("rpeg.ir.graph", "rpeg.search.optimizer", "rpeg.runtime.actors.driver"):
        assert m in mods
    for m in ("rpeg.flows.train", "rpeg.tasks.unit_tasks", "rpeg.infra.cluster"):
        assert m in mods, f"{m} missing: the mapped folders were not staged"


def test_no_import_cycle_inside_rpeg(tree):
    assert tree["cycles"] == [], "import cycles (strongly connected modules): " + "; ".join(
        " <-> ".join(c) for c in tree["cycles"]
    )


def test_layers_contract_holds_for_the_mapped_packages_too(tree):
    assert tree["illegal"] == []


def test_the_cycle_check_finds_a_cycle(tmp_path):
    """The check itself: a two-module package importing each other (one import lazy, as the
    IR's convenience methods did) is reported, a module outside the cycle is not."""
    pkg = tmp_path / "cyc_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyc_pkg.b import g\n\ndef f():\n    return g()\n")
    (pkg / "b.py").write_text("def g():\n    from cyc_pkg.a import f\n\n    return f\n")
    (pkg / "c.py").write_text("import cyc_pkg.a\n")
    got = _graph(tmp_path, "cyc_pkg", [["cyc_pkg.c"], ["cyc_pkg.a"]])
    assert got["cycles"] == [["cyc_pkg.a", "cyc_pkg.b"]]
    assert got["illegal"] == []
    got = _graph(tmp_path, "cyc_pkg", [["cyc_pkg.a"], ["cyc_pkg.c"]])  # c above a, inverted
    assert got["illegal"] == ["cyc_pkg.c -> cyc_pkg.a"]


# --------------------------------------------------------------------------- re-exports


def _imported_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def reexport_imports(modules: dict[str, Path]) -> list[str]:
    """``from M import X`` where M is a plain module (not a package) that itself imports X."""
    trees = {m: ast.parse(f.read_text(), str(f)) for m, f in modules.items()}
    imported = {m: _imported_names(t) for m, t in trees.items()}
    bad = []
    for m, t in trees.items():
        for node in ast.walk(t):
            if not isinstance(node, ast.ImportFrom) or node.level or node.module not in trees:
                continue
            if modules[node.module].name == "__init__.py":
                continue
            for a in node.names:
                if a.name in imported[node.module] and f"{node.module}.{a.name}" not in trees:
                    bad.append(f"{m}: {a.name} imported from {node.module}, which imports it")
    return bad


def test_names_are_imported_from_the_module_that_defines_them():
    assert reexport_imports(rpeg_module_files()) == []


def test_reexport_check_finds_a_reexport(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "__init__.py").write_text("from p.a import X\n")
    (tmp_path / "p" / "a.py").write_text("X = 1\n")
    (tmp_path / "p" / "b.py").write_text("from p.a import X  # noqa\n")
    (tmp_path / "p" / "c.py").write_text("from p.b import X\nfrom p import X as Y\n")
    mods = {f"p.{n}": tmp_path / "p" / f"{n}.py" for n in "abc"}
    mods["p"] = tmp_path / "p" / "__init__.py"
    assert reexport_imports(mods) == ["p.c: X imported from p.b, which imports it"]
