"""The Python API works from a script without ``if __name__ == "__main__":``.

Dask's ``LocalCluster`` starts its workers with multiprocessing's *spawn*: each new process
re-runs the parent's main script (as ``__mp_main__``) to rebuild its functions. A script
that calls ``run_train(...)`` at top level would then start a plan search, a Prefect server
and a flow inside every worker ("Nanny failed to start", hundreds of lines of log).

:func:`protect_unguarded_main` finds the line of the main script that is calling us (its
module-level frame) and, when that line is not inside an ``if __name__ == "__main__":``
block (read with :mod:`ast`, nothing executed), marks the main module as one that child
processes must not re-run: multiprocessing skips re-importing a main module whose spec
is named ``__main__``. The workers never needed the script: every object they run comes
from rpeg's own modules. A guarded script is left alone (its own functions then still reach
the workers).
"""

from __future__ import annotations

import ast
import importlib.machinery
import sys
from pathlib import Path


def _is_main_test(node: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either order)."""
    if not isinstance(node, ast.Compare) or len(node.comparators) != 1:
        return False
    sides = [node.left, node.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    consts = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and consts == ["__main__"]


def line_is_guarded(source: str, line: int) -> bool:
    """Is ``line`` of the module ``source`` inside an ``if __name__ == "__main__":`` block
    (or inside a function or class body, which the module does not run by itself)?"""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        end = getattr(node, "end_lineno", None)
        if end is None or not node.lineno <= line <= end:
            continue
        if isinstance(node, ast.If) and _is_main_test(node.test):
            return True
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return True
    return False


def unguarded_main_line() -> int | None:
    """The line of the main script running us at module level outside a ``__main__``
    guard, or None (no script, a guarded call, or a call from a function)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or getattr(main, "__spec__", None) is not None:
        return None  # an interactive session, ``python -m``, or already protected
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>":
            break
        frame = frame.f_back
    if frame is None:
        return None
    try:
        source = Path(path).read_text()
        return None if line_is_guarded(source, frame.f_lineno) else frame.f_lineno
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


def protect_unguarded_main(log=None) -> bool:
    """Keep spawned worker processes from re-running an unguarded main script (see the
    module doc); True when it did."""
    line = unguarded_main_line()
    if line is None:
        return False
    main = sys.modules["__main__"]
    main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
    if log is not None:
        log(
            f"note: {Path(main.__file__).name}:{line} runs training without "
            '`if __name__ == "__main__":`; worker processes will not re-run the script'
        )
    return True
