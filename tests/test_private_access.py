"""No rpeg module reaches into another's private names (issue 37: "no module calling another's
``_private`` members"). An AST scan of every module of the package (rpeg/ and the folders
installed as rpeg.flows, rpeg.tasks and rpeg.infra) fails, naming file:line and the name, where a
module

- imports a leading-underscore name from another rpeg module (``from rpeg.x import _y``,
  relative or absolute, at any depth: inside functions and in multi-line import lists), or
- reads a leading-underscore attribute of another rpeg module it imported
  (``import rpeg.x as m`` / ``from rpeg.a import b`` where ``b`` is a module, then ``m._y`` /
  ``b._y``; ``rpeg.x._y`` written out in full too).

Dunder names (``__name__``, ``__file__``, ...) are public. A private *module* (``specs/_load.py``)
is its package's: its siblings and the package's ``__init__`` import from it, nobody else.
Attributes of objects (``self._x``, ``obj._x``) are out of scope here: the rule is about modules.
A name that two modules share is public where it is defined (drop the underscore), or lives in
the module that owns the concept.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.module_files import ROOT, rpeg_module_files


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _package_of(module: str, is_package: bool) -> str:
    return module if is_package else module.rpartition(".")[0]


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module an ``ImportFrom`` names (``from ..a import b`` -> ``rpeg.x.a``)."""
    if not node.level:
        return node.module or ""
    base = _package_of(module, is_package).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _private_module_outside(target: str, importer: str, is_package: bool) -> str | None:
    """The first private component of ``target`` whose package ``importer`` is not inside."""
    parts = target.split(".")
    here = _package_of(importer, is_package)
    for i, p in enumerate(parts):
        if _private(p):
            owner = ".".join(parts[:i])
            if not (here == owner or here.startswith(owner + ".")):
                return ".".join(parts[: i + 1])
    return None


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"]; None for anything but names and attributes."""
    out = []
    while isinstance(node, ast.Attribute):
        out.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(out)]


def private_access(modules: dict[str, Path], root: Path = ROOT) -> list[str]:
    """``file:line: name`` for every reach into another rpeg module's private names."""
    bad: list[str] = []
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(root)
        aliases: dict[str, str] = {}  # local name -> the rpeg module (or package prefix) it is
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if not (a.name == "rpeg" or a.name.startswith("rpeg.")):
                        continue
                    hidden = _private_module_outside(a.name, module, is_package)
                    if hidden:
                        bad.append(f"{where}:{node.lineno}: imports {hidden}")
                    if a.asname:
                        aliases[a.asname] = a.name
                    else:
                        aliases["rpeg"] = "rpeg"
            elif isinstance(node, ast.ImportFrom):
                src = _resolve(node, module, is_package)
                if not (src == "rpeg" or src.startswith("rpeg.")):
                    continue
                hidden = _private_module_outside(src, module, is_package)
                if hidden:
                    bad.append(f"{where}:{node.lineno}: imports from {hidden}")
                for a in node.names:
                    full = f"{src}.{a.name}"
                    if full in modules:  # a submodule, bound as a module
                        aliases[a.asname or a.name] = full
                        hidden = _private_module_outside(full, module, is_package)
                        if hidden:
                            bad.append(f"{where}:{node.lineno}: imports {hidden}")
                    elif _private(a.name) and src != module:
                        bad.append(f"{where}:{a.lineno}: {src}.{a.name}")
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            chain = _dotted(node.value)
            if not chain or chain[0] not in aliases:
                continue
            target = ".".join([aliases[chain[0]], *chain[1:]])
            if target in modules and target != module:
                bad.append(f"{where}:{node.lineno}: {target}.{node.attr}")
    return sorted(set(bad), key=lambda b: (b.split(":")[0], int(b.split(":")[1]), b))


def test_no_module_reaches_into_another_modules_private_names():
    bad = private_access(rpeg_module_files())
    assert bad == [], "make the name public where it is defined:\n" + "\n".join(bad)


def test_the_scan_finds_each_kind_of_reach(tmp_path):
    pkg = tmp_path / "rpeg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "_x = 1\ny = 2\n__all__ = []\n",
        "sub/__init__.py": "from rpeg.sub._impl import z\n",  # its own private module: fine
        "sub/_impl.py": "z = 1\n",
        "b.py": (
            "import rpeg.a as m\n"
            "import rpeg.a\n"
            "from rpeg import a\n"
            "from rpeg.a import (\n"
            "    y,\n"
            "    _x,\n"
            ")\n"
            "def f(obj):\n"
            "    from rpeg.a import _x as q\n"
            "    from .sub._impl import z\n"
            "    return (\n"
            "        m._x,\n"
            "        a._x,\n"
            "        rpeg.a._x,\n"
            "        m.__name__, m.y, obj._x, q, z,\n"
            "    )\n"
        ),
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    mods = {
        "rpeg": pkg / "__init__.py",
        "rpeg.a": pkg / "a.py",
        "rpeg.b": pkg / "b.py",
        "rpeg.sub": pkg / "sub" / "__init__.py",
        "rpeg.sub._impl": pkg / "sub" / "_impl.py",
    }
    assert private_access(mods, tmp_path) == [
        "rpeg/b.py:6: rpeg.a._x",
        "rpeg/b.py:9: rpeg.a._x",
        "rpeg/b.py:10: imports from rpeg.sub._impl",
        "rpeg/b.py:12: rpeg.a._x",
        "rpeg/b.py:13: rpeg.a._x",
        "rpeg/b.py:14: rpeg.a._x",
    ]
