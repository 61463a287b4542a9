"""Markdown artifacts: any page, a checkpoint's location, the plan report, a refused run and
the run's numbers."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from uuid import UUID

from rpeg.flows.api_calls import api_call
from rpeg.flows.artifacts.context import default_key, fmt_value, in_prefect_run


def location_text(url: str) -> str:
    """A checkpoint or file location as markdown text: the path (or URL) in code font, and a
    link only for http(s) URLs (a browser opens no ``file://`` link from an http page)."""
    text = url if "://" in url else str(Path(url).resolve())
    if url.startswith(("http://", "https://")):
        return f"[`{text}`]({url})"
    return f"`{text}`"


def publish_checkpoint(
    url: str,
    step: int,
    *,
    key: str | None = None,
    score: float | None = None,
    description: str | None = None,
) -> UUID | None:
    """A markdown artifact naming a committed checkpoint (its folder or fsspec URL as text)."""
    if not in_prefect_run():
        return None
    text = f"checkpoint step {step}" + (f" (score {fmt_value(score)})" if score is not None else "")
    return publish_markdown(
        f"# {text}\n\n{location_text(url)}\n",
        key=key or default_key("checkpoint"),
        description=description or f"{text}: {url}",
    )


def publish_markdown(
    markdown: str, *, key: str | None = None, description: str | None = None
) -> UUID | None:
    if not in_prefect_run():
        return None
    from prefect.artifacts import create_markdown_artifact

    return api_call(
        "markdown", create_markdown_artifact, markdown=markdown, key=key, description=description
    )


def publish_plan_report(markdown: str | Path, *, key: str | None = None) -> UUID | None:
    """The ``rpeg plan`` report (markdown text, or the path of a .md file)."""
    if isinstance(markdown, Path) or (
        isinstance(markdown, str) and "\n" not in markdown and markdown.endswith(".md")
    ):
        try:
            markdown = Path(markdown).read_text()
        except OSError as exc:
            markdown = f"plan report not readable: {exc}"
    return publish_markdown(
        str(markdown), key=key or default_key("plan"), description="execution plan report"
    )


def summary_markdown(
    summary: Mapping[str, Any], title: str = "Run summary", out_dir: str | Path | None = None
) -> str:
    lines = [f"# {title}", "", "| metric | value |", "| --- | --- |"]
    for k, v in summary.items():
        if k.startswith("_") or isinstance(v, dict | list):
            continue
        lines.append(f"| {k} | {fmt_value(v)} |")
    if out_dir is not None:
        lines += ["", f"output folder: {location_text(str(out_dir))}"]
    return "\n".join(lines) + "\n"


def publish_summary(
    summary: Mapping[str, Any],
    *,
    key: str | None = None,
    title: str = "Run summary",
    out_dir: str | Path | None = None,
) -> UUID | None:
    return publish_markdown(
        summary_markdown(summary, title, out_dir),
        key=key or default_key("summary"),
        description=title,
    )


def publish_refused(reason: str, *, key: str | None = None) -> UUID | None:
    """The ``refused`` artifact of a run whose parameters or config were refused."""
    return publish_markdown(
        f"# Run refused\n\nNothing was started:\n\n```\n{reason}\n```\n",
        key=key or default_key("refused"),
        description=reason[:500],
    )
