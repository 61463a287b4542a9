"""Atomic checkpoints on any fsspec URL (local path, memory://, s3://, gs://).

Layout under the run's checkpoint URL (``runtime.checkpoint_url``)::

    <url>/<run_id>/step-00000010/<name>.pt     one state file per part (rank states, buffer,
                                               driver state): safetensors + a JSON tree
                                               (:mod:`rpeg.runtime.actors.state_file`)
    <url>/<run_id>/step-00000010/COMMIT.json   written last: format, run id, step, policy
                                               version, the sha256 and size of every part

Every run writes under its own run id (``runtime.run_id``; a fresh run gets a new one), so
runs sharing a checkpoint URL never prune or resume each other's checkpoints.
``--resume`` continues the one run found at the URL (or the run named by ``run_id``);
``--resume-from URL`` starts from a checkpoint of any run (a step folder, a run folder or a
checkpoint URL) and then writes under this run's id. A ``--resume`` that finds nothing
usable is an error listing what was found.

A directory without ``COMMIT.json`` is partial (the writer died) and is ignored; a failed
write removes its own partial directory and raises :class:`CheckpointWriteError` (disk full,
permission denied, ...), which the flow reports as such, never as a lost worker. A part
whose checksum does not match its commit marker makes the checkpoint corrupt: ``latest()``
warns and falls back to the previous complete one. ``keep_last`` complete checkpoints of
this run are kept; its older ones (and its partial ones older than the newest commit) are
deleted. Format-1 checkpoints (``torch.save`` pickles) are refused: loading them could run
code.

A store built without a run id (``CheckpointStore(url)``) keeps the flat layout
``<url>/step-N`` (used by single-folder tools such as the retrain flow's local engine).

What each module holds: ``layout`` (the folders, part files and commit marker; reading one
back verified; the errors), ``store`` (:class:`CheckpointStore`: one run's writes, pruning and
newest checkpoint), ``finding`` (what a URL holds, which run to resume, the resume checks),
``rank_state`` (one rank's state file).
"""

from rpeg.runtime.actors.checkpoint.finding import (
    check_resumable,
    find_checkpoint,
    resolve_run_id,
    survey,
)
from rpeg.runtime.actors.checkpoint.layout import (
    COMMIT,
    FORMAT_VERSION,
    CheckpointError,
    CheckpointInfo,
    CheckpointWriteError,
    dumps,
    loads,
    new_run_id,
    step_folder,
    step_url,
)
from rpeg.runtime.actors.checkpoint.rank_state import (
    load_rank_state_bytes,
    load_roles_state,
    rank_state_bytes,
    roles_state,
)
from rpeg.runtime.actors.checkpoint.store import CheckpointStore, check_writable

__all__ = [
    "COMMIT",
    "FORMAT_VERSION",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointStore",
    "CheckpointWriteError",
    "check_resumable",
    "check_writable",
    "dumps",
    "find_checkpoint",
    "load_rank_state_bytes",
    "load_roles_state",
    "loads",
    "new_run_id",
    "rank_state_bytes",
    "roles_state",
    "resolve_run_id",
    "step_folder",
    "step_url",
    "survey",
]
