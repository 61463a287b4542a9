"""Help texts as paragraphs: the commands' docstrings are wrapped at ~95 columns in the source;
Typer's rich help keeps those line breaks and wraps each line again at the terminal's width,
so ``rpeg --help`` broke lines mid-sentence. :func:`reflow_help` joins the lines of each
paragraph (blank-line separated) once, at start-up, so the terminal wraps whole paragraphs."""

from __future__ import annotations

import inspect
from typing import Any


def reflow(text: str | None) -> str | None:
    """``text`` with the single line breaks inside each paragraph replaced by spaces. A
    paragraph that starts with ``\\b`` (click's keep-as-is mark), or with an indented or bullet
    line, is kept as written."""
    if not text:
        return text
    out = []
    for para in inspect.cleandoc(text).split("\n\n"):
        lines = para.splitlines()
        keep = para.startswith("\b") or any(
            ln.startswith((" ", "\t", "- ", "* ", "|")) for ln in lines
        )
        out.append(para if keep else " ".join(ln.strip() for ln in lines))
    return "\n\n".join(out)


def reflow_help(app: Any) -> None:
    """Set every registered command's and command group's help (``app``: a typer.Typer)
    to its reflowed text (the docstring where no help is given)."""
    for info in app.registered_commands:
        info.help = reflow(info.help or inspect.getdoc(info.callback))
    for group in app.registered_groups:
        sub = group.typer_instance
        if group.help:
            group.help = reflow(group.help)
        if sub is not None:
            if sub.info.help:
                sub.info.help = reflow(sub.info.help)
            cb = sub.registered_callback
            if cb is not None and cb.help is None and cb.callback is not None:
                cb.help = reflow(inspect.getdoc(cb.callback))
            reflow_help(sub)
