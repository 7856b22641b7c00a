"""A state file read again only when it changed: a scrape of a collector that exports a file in
the state directory (``soak.json``, ``storage.json``) costs one ``stat``."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from sparkdiag.errors import SparkdiagError

log = logging.getLogger(__name__)
T = TypeVar("T")


class FileCache(Generic[T]):
    """``read(path)`` again when the file's inode, size or modification time changed; None when
    there is no file, no path, or the file cannot be used (logged once per change as ``what``
    not exported)."""

    def __init__(self, path: Path | None, read: Callable[[Path], T | None], what: str) -> None:
        self.path = path
        self._read = read
        self._what = what
        self._lock = threading.Lock()
        self._key: tuple[int, int, int] | None = None
        self._value: T | None = None

    def get(self) -> T | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            with self._lock:
                self._key, self._value = None, None
            return None
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            if key != self._key:
                try:
                    self._value = self._read(self.path)
                except SparkdiagError as exc:
                    log.warning("%s not exported: %s", self._what, exc)
                    self._value = None
                self._key = key
            return self._value
