"""Errors every layer shares.

Bad input is reported as one error that lists *every* problem found, each naming where it
is (a dotted field path, a stage name, a CSV row) and what is allowed. The CLI turns any
:class:`RpegError` into that message and exit code 2, with no traceback unless ``--debug``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: ``where`` it is and ``what`` is wrong."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}" if self.where else self.what


class RpegError(Exception):
    """Base class of every error RPEG raises on purpose (bad input, infeasible plan...)."""

    exit_code = 2


class ProblemsError(RpegError):
    """An input with one or more problems, all reported at once."""

    title = "invalid input"

    def __init__(self, problems: Iterable[Problem | str] | str, *, title: str | None = None):
        if isinstance(problems, str):  # one message, not one problem per character
            problems = [problems]
        self.problems: tuple[Problem, ...] = tuple(
            p if isinstance(p, Problem) else Problem("", p) for p in problems
        )
        if title is not None:
            self.title = title
        super().__init__(self._render())

    def __reduce__(self):
        # pickled across process boundaries (a ConfigError raised in a Dask actor): keep the
        # problem list; the default would rebuild the error from its rendered message
        return (_rebuild_problems, (type(self), self.problems, self.title))

    def _render(self) -> str:
        n = len(self.problems)
        head = f"{self.title} ({n} problem{'s' if n != 1 else ''}):"
        return "\n".join([head, *(f"  - {p}" for p in self.problems)])


def _rebuild_problems(cls: type, problems: tuple[Problem, ...], title: str) -> ProblemsError:
    return cls(problems, title=title)


class ConfigError(ProblemsError):
    """A configuration file or object that does not validate."""

    title = "invalid configuration"
