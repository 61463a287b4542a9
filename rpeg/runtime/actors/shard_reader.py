"""A checkpoint's ``torch.distributed.checkpoint`` shards read in one process, without a
process group and without running code from the checkpoint (``rpeg export``).

A sharded group's ranks write their shards of the weights and optimizer state with DCP
(rpeg.runtime.actors.shard_checkpoint); DCP records every tensor's global shape and each
shard's offsets in the folder's ``.metadata``, so one process can ask for whole tensors and
DCP assembles them from whatever layout wrote them (FSDP dp=N, tp=N, both).

Why not ``dcp.load`` with torch's own reader: in torch 2.13 ``FileSystemReader.read_metadata``
unpickles ``.metadata`` with the unrestricted pickle module (a crafted file runs code when
read), and the default load planner reads non-tensor values with weights_only off.
Here ``.metadata`` is read by an unpickler that only builds DCP's own metadata classes,
``torch.Size``, torch dtypes and layouts, and paths (anything else is a
:class:`CheckpointError` naming the global), only tensor entries are asked for, and the
planner refuses a non-tensor read; the tensor data itself is read by DCP with
``torch.load(weights_only=True)``. A resume (rpeg.runtime.actors.shard_checkpoint.load_shards)
reads its shards through the same metadata reader, and its non-tensor values (optimizer
hyperparameters, versions) with ``torch.load(weights_only=True)`` (:func:`weights_only_planner`).
"""

from __future__ import annotations

import contextlib
import io
import pickle
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from rpeg.runtime.actors.checkpoint import CheckpointError

if TYPE_CHECKING:
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata

#: DCP's metadata file in a shards folder
METADATA = ".metadata"
#: what the metadata may name besides torch's dtypes (module, class or function)
_ALLOWED = {
    ("torch.distributed.checkpoint.metadata", n)
    for n in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "StorageMeta",
        "MetadataIndex",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by its name (torch.strided)
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id: where it was written
    ("pathlib", "WindowsPath"),
    ("pathlib._local", "PosixPath"),
    ("pathlib._local", "WindowsPath"),
}


def is_local_url(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def local_path(url: str) -> str:
    return url[len("file://") :] if url.startswith("file://") else url


@contextlib.contextmanager
def single_process_quiet(single: bool) -> Iterator[None]:
    """DCP warns that it assumes one process when no group exists; that is the intent here."""
    with warnings.catch_warnings():
        if single:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


@contextlib.contextmanager
def named_errors() -> Iterator[None]:
    """DCP wraps a reader's or planner's error in its ``CheckpointException`` (a
    BaseException, per rank): the first :class:`CheckpointError` inside is raised as itself."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as exc:
        for err, _ in exc.failures.values():
            if isinstance(err, CheckpointError):
                raise err from None
        raise


def allowed_global(module: str, name: str) -> bool:
    """Whether the metadata unpickler builds ``module.name`` (a torch dtype, or one of
    :data:`_ALLOWED`)."""
    if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
        return True
    return (module, name) in _ALLOWED


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, fh: Any, where: str):
        super().__init__(fh)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if not allowed_global(module, name):
            raise CheckpointError(
                f"{self.where}: the torch.distributed.checkpoint metadata names "
                f"{module}.{name}, which is not one of DCP's metadata classes; not loaded"
            )
        return super().find_class(module, name)


def read_metadata(fh: Any, where: str) -> Metadata:
    """DCP's ``Metadata`` from the open file ``fh`` through the restricted unpickler."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        md = _MetadataUnpickler(fh, where).load()
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 -- a truncated or foreign file
        raise CheckpointError(f"{where}: unreadable DCP metadata ({exc})") from None
    if not isinstance(md, Metadata):
        raise CheckpointError(f"{where}: not DCP metadata (a {type(md).__name__})")
    return md


def safe_reader(url: str) -> FileSystemReader:
    """torch's reader of ``url`` with :func:`read_metadata` in place of its unrestricted unpickling."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    base: type[FileSystemReader]
    if is_local_url(url):
        base, path = FileSystemReader, local_path(url)
    else:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        base, path = FsspecReader, url

    class SafeReader(base):  # type: ignore[valid-type,misc]  # the base is chosen at run time
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            where = f"{url.rstrip('/')}/{METADATA}"
            try:
                stream = self.fs.create_stream(self.fs.concat_path(self.path, METADATA), "rb")
                with stream as fh:
                    md = read_metadata(fh, where)
            except FileNotFoundError:
                raise CheckpointError(f"{where}: missing (not a DCP shards folder)") from None
            meta = getattr(md, "storage_meta", None)
            if meta is None:
                meta = md.storage_meta = StorageMeta()
            meta.load_id = self.load_id
            return md

    return SafeReader(path)


def _tensors_only_planner() -> DefaultLoadPlanner:
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class TensorsOnly(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: Any) -> None:  # never unpickle a value
            raise CheckpointError(f"{read_item.dest_index.fqn}: not a tensor; not loaded")

    return TensorsOnly()


def weights_only_planner() -> DefaultLoadPlanner:
    """DCP's default load planner, but a non-tensor value (an optimizer's hyperparameters, an
    int) is read with ``torch.load(weights_only=True)``: plain values, containers and tensors
    only; anything else is a :class:`CheckpointError` (torch's own reads it with weights_only
    off)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class WeightsOnlyValues(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: Any) -> None:
            try:
                obj = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as exc:
                fqn = read_item.dest_index.fqn
                raise CheckpointError(f"{fqn}: refused, not a plain value ({exc})") from None
            buf = io.BytesIO()  # DCP's own placement of the value, given the checked copy
            torch.save(obj, buf)
            buf.seek(0)
            super().load_bytes(read_item, buf)

    return WeightsOnlyValues()


def read_tensors(url: str, prefix: str) -> dict[str, torch.Tensor]:
    """Every tensor of the shards folder ``url`` whose key starts with ``prefix``, whole, on
    the CPU, keyed without the prefix ({} when none). One process, no process group."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = safe_reader(url).read_metadata()
    state = {
        k: torch.empty(tuple(m.size), dtype=m.properties.dtype)
        for k, m in md.state_dict_metadata.items()
        if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)
    }
    if state:
        with single_process_quiet(True), named_errors():
            dcp.load(
                state,
                storage_reader=safe_reader(url),
                planner=_tensors_only_planner(),
                no_dist=True,
            )
    return {k[len(prefix) :]: v for k, v in state.items()}
