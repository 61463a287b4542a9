"""One preparation path for every way a run starts (``rpeg train`` on either runtime, a
deployed ``train`` run, Python's ``run_train``): :func:`prepare_run`.

In this order, before any Prefect API, Dask cluster or model starts:

1. what the data says: ``workload.max_prompt_tokens`` fitted to the prompts as the model
   gets them, overlong prompts counted (:func:`rpeg.runtime.datasets.fit.fit_prompt_lengths`);
2. the run id: ``runtime.run_id``, the one run found at the checkpoint URL for ``--resume``,
   else a new one (``new_id`` when given: a deployed run's name);
3. the run folder ``<output_dir>/<run id>/`` (with ``run_folder``; ``runtime.output_dir``
   points there from now on);
4. one validation pass (:func:`rpeg.preflight.preflight`, with the engine check of the
   distributed runtime): every problem of steps 1-4 in one :class:`ConfigError`;
5. the locks on the run folder and the local checkpoint location (a second writer is
   refused, :class:`rpeg.runtime.run_folder.RunLocked`), then the folder's ``config.yaml``
   and ``<output_dir>/latest``.

The caller releases the locks when the run ends (:meth:`PreparedRun.release`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rpeg.config import RunConfig
from rpeg.errors import ConfigError

if TYPE_CHECKING:
    from rpeg.compile.step import CompiledStep


@dataclass
class PreparedRun:
    config: RunConfig
    compiled: CompiledStep | None = None  # the compiled step (None for the single-process trainer)
    folder: Path | None = None  # the run folder (None: writes into runtime.output_dir)
    lease: Any = None  # rpeg.runtime.run_folder.RunLease
    notes: list[str] = field(default_factory=list)

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None


def _with_run_id(config: RunConfig, new_id: str | None) -> RunConfig:
    from rpeg.runtime.actors.checkpoint import resolve_run_id

    rt = config.runtime
    if rt.run_id:
        return config
    fresh = new_id and not (rt.resume and not rt.resume_from and rt.checkpoint_url)
    rid = new_id if fresh else resolve_run_id(rt)
    return config.with_overrides({"runtime.run_id": rid})


def prepare_run(
    config: RunConfig,
    *,
    local: bool = False,
    cluster_devices: int | None = None,
    output_files: dict[str, str | None] | None = None,
    run_folder: bool = True,
    new_id: str | None = None,
    log: Callable[[str], None] | None = None,
) -> PreparedRun:
    """See the module doc. ``local``: the single-process trainer (no plan compiled);
    ``cluster_devices``: an existing cluster's devices (None: a LocalCluster here)."""
    from rpeg.runtime import run_folder as RF
    from rpeg.runtime.datasets.fit import fit_prompt_lengths

    errors: list[ConfigError] = []
    try:
        config = fit_prompt_lengths(config, log=log)
    except ConfigError as exc:  # bad rows are listed with every other problem below
        errors.append(exc)
    try:
        config = _with_run_id(config, new_id)
    except ConfigError as exc:
        errors.append(exc)
    rt = config.runtime
    folder = None
    if run_folder and rt.run_id:
        if RF.is_run_folder(rt.output_dir, rt.run_id):
            folder = Path(rt.output_dir)  # prepared before (a deployment's own run)
        else:
            folder = RF.run_folder(rt.output_dir, rt.run_id)
            config = config.with_overrides({"runtime.output_dir": str(folder)})
    from rpeg.preflight import preflight

    compiled = preflight(
        config, local=local, cluster_devices=cluster_devices, output_files=output_files
    )
    if errors:
        raise errors[0]
    if compiled is not None:
        from rpeg.runtime.engines.choice import check_engine

        check_engine(config, compiled)
    rt = config.runtime
    # without a run folder of its own the run owns runtime.output_dir as it is
    owned = folder if folder is not None else Path(rt.output_dir)
    lease = RF.lock_run(owned, rt.checkpoint_url, rt.run_id) if rt.run_id else None
    prepared = PreparedRun(config, compiled, folder, lease)
    for owner in lease.took_over if lease is not None else []:
        prepared.notes.append(f"took over the stale lock of {RF.owner_line(owner)}")
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            RF.write_config(folder, config)
            latest = folder.parent / RF.LATEST
            was_real = latest.is_dir() and not latest.is_symlink()
            if RF.point_latest(folder) is not None and was_real:
                kept = sorted(folder.parent.glob(f"{RF.LATEST}.before-*"))[-1:]
                prepared.notes.append(
                    f"{latest} was a folder of earlier outputs: kept as {kept[0] if kept else '?'}"
                    f"; {latest} now points at this run's folder"
                )
        except BaseException:
            prepared.release()
            raise
    return prepared


__all__ = ["PreparedRun", "prepare_run"]
