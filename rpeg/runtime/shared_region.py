"""A shared-memory region for two processes on one host (:class:`SharedRegion`): an anonymous
``memfd`` (no name in any file system) mapped here, whose descriptor goes to the peer over a
Unix socket (``SCM_RIGHTS``) and is then closed; the peer maps the same memory from it. Used
by :mod:`rpeg.runtime.pair_channel` for the bytes of a pair exchange."""

from __future__ import annotations

import contextlib
import mmap
import os
import socket

import torch


class SharedRegion:
    """A shared-memory region mapped here: an anonymous ``memfd``, whose descriptor is kept
    only until it has been handed to the peer (``send_fd``); the peer maps the same file from
    the descriptor it got and closes that (``adopt``). A mapping outlives its descriptor."""

    def __init__(self, fd: int, size: int):
        self.size = size
        self._map = mmap.mmap(fd, size)
        self.bytes = torch.frombuffer(self._map, dtype=torch.uint8)
        self.fd: int | None = fd

    @classmethod
    def create(cls, size: int) -> SharedRegion:
        fd = os.memfd_create("rpeg-pair", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            return cls(fd, size)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def adopt(cls, fd: int, size: int) -> SharedRegion:
        try:
            if os.fstat(fd).st_size < size:
                raise ConnectionError(f"pair channel: a peer region of {size} bytes is short")
            region = cls(fd, size)
        finally:
            os.close(fd)
        region.fd = None
        return region

    def send_fd(self, sock: socket.socket, head: bytes) -> None:
        """``head`` with this region's descriptor attached; the descriptor is closed here."""
        try:
            socket.send_fds(sock, [head], [self.fd])
        finally:
            self._close_fd()

    def _close_fd(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None

    def close(self) -> None:
        """Drop this region: unmapped once no tensor views it (a tensor from
        ``torch.frombuffer`` holds the mapping object, not a buffer export, so an explicit
        ``mmap.close()`` would unmap memory a live view still points at)."""
        self.bytes = self._map = None
        self._close_fd()
