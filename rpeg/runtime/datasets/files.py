"""Rows of a data file and the examples they make.

Formats (``task.kind``): ``jsonl`` (one JSON object a line), ``parquet`` and ``hf`` (a
folder written by ``datasets.Dataset.save_to_disk`` -- Arrow stream files -- or a folder of
``*.parquet`` / ``*.jsonl`` files as ``load_dataset`` reads them; ``<folder>#<split>`` picks a
split sub-folder or the files whose names start with the split, default ``train``).

Columns (:class:`RowKeys`): by default the first present of ``question`` / ``problem`` /
``prompt`` and of ``answer`` / ``solution`` / ``reward_model.ground_truth``: GSM8K
(``question``, ``answer`` with the final answer after ``####``), verl's parquet (``prompt`` =
chat messages, ``reward_model.ground_truth``) and TRL conversational data (``prompt`` =
messages) read as they are; other columns with ``task.prompt_key`` / ``task.answer_key``.
A JSON line that is not UTF-8 is a problem naming its line and byte (a byte-order mark is
dropped).

Reading is bounded (issue 44): a data file must be a regular file of at most
:data:`MAX_DATA_BYTES` (``/dev/zero``, a pipe or a socket is refused before a byte is read), a
JSON line at most :data:`MAX_LINE_CHARS`; an unreadable parquet or Arrow file is a problem
naming the file; a null prompt or answer is named as null, not as a missing column; a file
whose prompts are all empty is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rpeg.errors import ConfigError, Problem

#: bad rows reported per data file (the rest are counted)
MAX_ROW_PROBLEMS = 20
#: prompt columns tried in order when task.prompt_key is not set
DEFAULT_PROMPT_KEYS = ("question", "problem", "prompt")
#: answer columns tried in order when task.answer_key is not set (the last: verl's layout)
DEFAULT_ANSWER_KEYS = ("answer", "solution", "reward_model.ground_truth")
#: the largest data file read (bytes) and the longest JSON line (characters)
MAX_DATA_BYTES = 4 * 2**30
MAX_LINE_CHARS = 64 * 2**20


@dataclass(frozen=True)
class ChatMessage:
    """One message of a chat prompt (verl's and TRL's ``{role, content}``)."""

    role: str
    content: str


@dataclass(frozen=True)
class RowText:
    """What a row holds for an example (rpeg.runtime.data.load_examples makes the
    :class:`rpeg.runtime.data.Example`)."""

    question: str
    answer: str
    solution: str
    messages: tuple[ChatMessage, ...] = ()
    system_prompt: str = ""
    data_source: str = ""  # the row's ``data_source`` column (verl), "" when absent


#: the column naming where a row comes from (verl's parquet files: ``openai/gsm8k``, ...)
DATA_SOURCE_KEY = "data_source"


def row_source(row: Any) -> str:
    """The row's ``data_source`` as text ("" when absent or not text/number)."""
    v = row.get(DATA_SOURCE_KEY) if isinstance(row, dict) else None
    if isinstance(v, str):
        return v.strip()
    if isinstance(v, int | float) and not isinstance(v, bool):
        return str(v)
    return ""


@dataclass(frozen=True)
class RowKeys:
    """Where a row keeps its prompt and its reference answer."""

    prompt_key: str | None = None
    answer_key: str | None = None
    system_prompt: str | None = None

    @classmethod
    def from_task(cls, task: Any) -> RowKeys:
        return cls(
            getattr(task, "prompt_key", None),
            getattr(task, "answer_key", None),
            getattr(task, "system_prompt", None),
        )


def gsm8k_final_answer(answer: str) -> str:
    """GSM8K: the final answer follows ``####``."""
    return (
        answer.rsplit("####", 1)[1].strip().replace(",", "") if "####" in answer else answer.strip()
    )


_MISSING = object()


def dotted_get(row: Any, path: str) -> Any:
    """``row["a"]["b"]`` for ``"a.b"`` (a JSON-encoded text on the way is decoded: verl's
    ``extra_info`` is sometimes a string); :data:`_MISSING` when absent."""
    node = row
    for part in path.split("."):
        if isinstance(node, str):
            try:
                node = json.loads(node)
            except (ValueError, RecursionError):
                return _MISSING
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _first(row: dict, names: tuple[str, ...]) -> tuple[str | None, Any]:
    for n in names:
        got = dotted_get(row, n)  # a plain name is a one-part path
        if got is not None and got is not _MISSING:
            return n, got
    return None, _MISSING


def _messages_problem(value: list) -> str | None:
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            return f"message {i} must be {{role, content}} with text content (got {m!r:.60})"
        if m.get("role") not in ("system", "user", "assistant", "tool"):
            return (
                f"message {i} role must be system, user, assistant or tool (got {m.get('role')!r})"
            )
    if not value:
        return "holds no messages"
    return None


def row_problem(row: Any, keys: RowKeys = RowKeys()) -> str | None:
    """Why ``row`` is not an example, or None."""
    pk = f"'{keys.prompt_key}'" if keys.prompt_key else "'question'"
    ak = f"'{keys.answer_key}'" if keys.answer_key else "'answer'"
    if not isinstance(row, dict):
        return f"a row must be a JSON object with {pk} and {ak} (got {type(row).__name__})"
    hint = f"columns: {sorted(map(str, row))}; set task.prompt_key / task.answer_key"
    if keys.prompt_key:
        q = dotted_get(row, keys.prompt_key)
        if q is _MISSING:
            return f"row has no {pk} ({hint})"
        if q is None:
            return f"{pk} is null in this row (a prompt must be text or chat messages)"
    else:
        _, q = _first(row, DEFAULT_PROMPT_KEYS)
    if keys.answer_key:
        a = dotted_get(row, keys.answer_key)
        if a is _MISSING:
            return f"row has no {ak} ({hint})"
        if a is None:
            return f"{ak} is null in this row (an answer must be text or a number)"
    else:
        _, a = _first(row, DEFAULT_ANSWER_KEYS)
    nulls = [
        repr(k)
        for k, got, names in (("q", q, DEFAULT_PROMPT_KEYS), ("a", a, DEFAULT_ANSWER_KEYS))
        if got is _MISSING
        for k in names
        if k in row and row[k] is None
    ]
    if nulls:
        return f"{', '.join(nulls)} {'is' if len(nulls) == 1 else 'are'} null in this row ({hint})"
    if q is _MISSING or a is _MISSING:
        missing = [
            f"{what} ({', '.join(repr(k) for k in names)})"
            for what, got, names in (
                ("prompt", q, DEFAULT_PROMPT_KEYS),
                ("reference answer", a, DEFAULT_ANSWER_KEYS),
            )
            if got is _MISSING
        ]
        return f"row has no {' and no '.join(missing)} ({hint})"
    if isinstance(q, list):
        why = _messages_problem(q)
        if why:
            return f"prompt {why}"
    elif not isinstance(q, str):
        return f"prompt {pk} must be text or a list of chat messages (got {type(q).__name__})"
    if not isinstance(a, str | int | float) or isinstance(a, bool):
        return f"answer {ak} must be text or a number (got {type(a).__name__})"
    return None


def row_text(row: dict[str, Any], where: str, keys: RowKeys = RowKeys()) -> RowText:
    """The example a row holds (``ConfigError`` naming ``where``)."""
    why = row_problem(row, keys)
    if why:
        raise ConfigError([Problem(where, why)])
    q = dotted_get(row, keys.prompt_key) if keys.prompt_key else _first(row, DEFAULT_PROMPT_KEYS)[1]
    a = dotted_get(row, keys.answer_key) if keys.answer_key else _first(row, DEFAULT_ANSWER_KEYS)[1]
    a = str(a)
    messages: tuple = ()
    if isinstance(q, list):
        messages = tuple(ChatMessage(str(m["role"]), m["content"]) for m in q)
        users = [m.content for m in messages if m.role == "user"]
        question = users[-1] if users else messages[-1].content
    else:
        question = q
    if keys.system_prompt and messages and messages[0].role != "system":
        messages = (ChatMessage("system", keys.system_prompt), *messages)
    return RowText(
        question,
        gsm8k_final_answer(a),
        solution=a,
        messages=messages,
        system_prompt=keys.system_prompt or "",
        data_source=row_source(row),
    )


# --- reading ------------------------------------------------------------------------------
def _split_of(url: str) -> tuple[str, str]:
    if "#" in url:
        base, split = url.rsplit("#", 1)
        return base, split or "train"
    return url, "train"


def _hf_files(url: str) -> list[tuple[str, str]]:
    """(fsspec URL, kind) of the files of a ``datasets`` folder's split."""
    import fsspec

    base, split = _split_of(url)
    fs, root = fsspec.core.url_to_fs(base)
    if not fs.isdir(root):
        raise FileNotFoundError(base)
    root = root.rstrip("/")
    sub = f"{root}/{split}"
    if fs.isdir(sub):  # DatasetDict.save_to_disk: one folder per split
        root = sub
    files = sorted(fs.find(root))
    proto = base.split("://", 1)[0] + "://" if "://" in base else ""

    def kind(p: str) -> str | None:
        for ext, k in ((".arrow", "arrow"), (".parquet", "parquet"), (".jsonl", "jsonl")):
            if p.endswith(ext):
                return k
        return None

    found = [(p, kind(p)) for p in files if kind(p)]
    named = [(p, k) for p, k in found if p.rsplit("/", 1)[-1].startswith(split)]
    if named and len(named) < len(found):  # load_dataset's data/<split>-00000-of-00001.parquet
        found = named
    return [(proto + p if proto and not p.startswith(proto) else p, k) for p, k in found]


def readable_problem(url: str) -> str | None:
    """Why ``url`` is not a data file to read (not a regular file, or over
    :data:`MAX_DATA_BYTES`), or None. ``FileNotFoundError`` when it does not exist."""
    import os
    import stat

    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("file", "local"):
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            return "is a folder; expected a data file (task.kind: hf reads a folder)"
        if not stat.S_ISREG(st.st_mode):
            return "is not a regular file (a device, pipe or socket: its reads may never end)"
        size = st.st_size
    else:
        info = fs.info(path)
        if info.get("type") not in (None, "file"):
            return f"is a {info.get('type')}; expected a data file"
        size = int(info.get("size") or 0)
    if size > MAX_DATA_BYTES:
        return f"is {size} bytes; a data file is read up to {MAX_DATA_BYTES} bytes"
    return None


def _table_rows(url: str, kind: str) -> list[Any]:
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    with fsspec.open(url, "rb") as fh:
        if kind == "parquet":
            return pq.read_table(fh).to_pylist()
        data = fh.read()
    try:  # save_to_disk writes the Arrow IPC stream format
        return pa.ipc.open_stream(pa.py_buffer(data)).read_all().to_pylist()
    except pa.ArrowInvalid:
        return pa.ipc.open_file(pa.py_buffer(data)).read_all().to_pylist()


def _table_or_problem(url: str, kind: str, problems: list[Problem], where: str) -> list[Any]:
    """The rows of a parquet / Arrow file; an unreadable one is a problem naming the file (a
    corrupt parquet was ``ArrowInvalid ... '<Buffer>'``, exit 1, the file unnamed)."""
    import pyarrow as pa

    try:
        return _table_rows(url, kind)
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        problems.append(
            Problem(
                where,
                f"{url!r} is not a readable {kind} file ({type(exc).__name__}: {str(exc).strip()})",
            )
        )
        return []


def read_rows(
    url: str,
    kind: str,
    problems: list[Problem],
    limit: int,
    keys: RowKeys = RowKeys(),
    where: str = "task.url",
) -> list[tuple[int, Any]]:
    """(line or row number, row) of every parsable row; every bad one (up to ``limit``)
    becomes a problem, the rest are counted in one more."""
    import fsspec

    bad: list[tuple[int, str]] = []  # (line, what), reported in line order
    rows: list[tuple[int, Any]] = []
    if kind in ("parquet", "hf"):
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            problems.append(Problem(where, f"reading {kind} needs pyarrow (pip install pyarrow)"))
            return []
    if kind != "hf":
        why = readable_problem(url)
        if why:
            problems.append(Problem(where, f"{url!r} {why}"))
            return []
    if kind == "hf":
        files = _hf_files(url)
        if not files:
            problems.append(Problem(where, f"{url!r} holds no .arrow, .parquet or .jsonl files"))
            return []
        n = 0
        for f, k in files:
            if k == "jsonl":
                got = read_rows(f, k, problems, limit, keys, where)
                items = [r for _, r in got]
            else:
                why = readable_problem(f)
                items = _table_or_problem(f, k, problems, where) if not why else []
                if why:
                    problems.append(Problem(where, f"{f!r} {why}"))
            rows += [(n + i, r) for i, r in enumerate(items, start=1)]
            n += len(items)
        if any(k == "jsonl" for _, k in files):
            return rows  # their rows were checked file by file
    elif kind == "parquet":
        rows = list(enumerate(_table_or_problem(url, "parquet", problems, where), start=1))
    else:
        # undecodable bytes kept as surrogates: a line that is not UTF-8 is named, not a
        # UnicodeDecodeError ending the read; a byte-order mark is dropped
        with fsspec.open(url, "r", encoding="utf-8-sig", errors="surrogateescape") as fh:
            i = 0
            while True:
                line = fh.readline(MAX_LINE_CHARS + 1)
                if not line:
                    break
                i += 1
                if len(line) > MAX_LINE_CHARS:
                    while line and not line.endswith("\n"):  # the rest of the line, skipped
                        line = fh.readline(MAX_LINE_CHARS)
                    bad.append((i, f"line longer than {MAX_LINE_CHARS} characters"))
                    continue
                if not line.strip():
                    continue
                try:
                    line.encode("utf-8")
                except UnicodeEncodeError as exc:
                    byte = ord(line[exc.start]) - 0xDC00
                    bad.append(
                        (
                            i,
                            f"not UTF-8 text (byte 0x{byte:02x} at character {exc.start + 1}): "
                            "save the file as UTF-8",
                        )
                    )
                    continue
                try:
                    rows.append((i, json.loads(line)))
                except ValueError as exc:
                    bad.append((i, f"not valid JSON: {exc}"))
                except RecursionError:  # was a bare RecursionError ending the run
                    bad.append((i, "JSON nested too deeply to read (Python's recursion limit)"))
    for i, row in rows:
        why = row_problem(row, keys)
        if why:
            bad.append((i, why))
    bad.sort()
    problems += [Problem(f"{url}:{i}", what) for i, what in bad[:limit]]
    if len(bad) > limit:
        problems.append(Problem(url, f"... and {len(bad) - limit} more bad rows"))
    return rows


def file_kind(url: str, kind: str | None) -> str:
    if kind in ("jsonl", "parquet", "hf"):
        return kind
    return "parquet" if url.endswith(".parquet") else "jsonl"


def check_examples(
    url: str,
    kind: str | None = None,
    limit: int = MAX_ROW_PROBLEMS,
    keys: RowKeys = RowKeys(),
    where: str = "task.url",
) -> list[Problem]:
    """Every problem with a data file (missing, empty, each bad row up to ``limit``);
    ``where``: the config field that names the file."""
    problems: list[Problem] = []
    kind = file_kind(url, kind)
    try:
        rows = read_rows(url, kind, problems, limit, keys, where)
    except FileNotFoundError:
        return [Problem(where, f"file {url!r} not found")]
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return [Problem(where, f"{url!r} cannot be read: {type(exc).__name__}: {exc}")]
    if not rows and not problems:
        problems.append(Problem(where, f"{url!r} holds no examples"))
    elif rows and not problems and all(_empty_prompt(r, keys) for _, r in rows):
        problems.append(
            Problem(
                where,
                f"all {len(rows)} prompts of {url!r} are empty: the model would be trained "
                "on no question (check task.prompt_key)",
            )
        )
    return problems


def _empty_prompt(row: Any, keys: RowKeys) -> bool:
    q = dotted_get(row, keys.prompt_key) if keys.prompt_key else _first(row, DEFAULT_PROMPT_KEYS)[1]
    if isinstance(q, list):
        return all(not str(m.get("content", "")).strip() for m in q if isinstance(m, dict))
    return isinstance(q, str) and not q.strip()


def load_row_texts(
    url: str, kind: str | None = None, keys: RowKeys = RowKeys(), where: str = "task.url"
) -> list[RowText]:
    """Read a data file (local path or fsspec URL) into row texts; every bad row (up to
    :data:`MAX_ROW_PROBLEMS`) is reported at once."""
    kind = file_kind(url, kind)
    problems: list[Problem] = []
    try:
        rows = read_rows(url, kind, problems, MAX_ROW_PROBLEMS, keys, where)
    except FileNotFoundError:
        raise ConfigError([Problem(where, f"file {url!r} not found")]) from None
    if problems:
        raise ConfigError(problems, title=f"invalid data file {url}")
    if not rows:
        raise ConfigError([Problem(where, f"{url!r} holds no examples")])
    return [row_text(r, f"{url}:{i}", keys) for i, r in rows]
