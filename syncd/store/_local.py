"""A store in a local directory: the embedded default, no S3 needed."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from ._base import AlreadyExists, NotFound, ObjectInfo, StoreError, check_key


class LocalStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = root.as_uri() + "/"
        try:
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise StoreError(f"{self.url}: cannot create store directory: {e.strerror}") from e

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put(self, key: str, data: bytes, *, if_none_match: bool = True) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        except OSError as e:
            raise StoreError(f"{self.url}{key}: {e.strerror}") from e
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if if_none_match:
                # link() fails with EEXIST instead of replacing: an atomic create-if-absent.
                os.link(tmp, path)
            else:
                os.replace(tmp, path)
            _fsync_dir(path.parent)
        except FileExistsError:
            raise AlreadyExists(f"{self.url}{key}: already exists") from None
        except OSError as e:
            raise StoreError(f"{self.url}{key}: {e.strerror or e}") from e
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                if start < 0:
                    f.seek(max(0, os.fstat(f.fileno()).st_size + start))
                else:
                    f.seek(start)
                return f.read() if length is None else f.read(length)
        except FileNotFoundError:
            raise NotFound(f"{self.url}{key}: not found") from None
        except OSError as e:
            raise StoreError(f"{self.url}{key}: {e.strerror or e}") from e

    def head(self, key: str) -> ObjectInfo | None:
        try:
            return ObjectInfo(key, self._path(key).stat().st_size)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StoreError(f"{self.url}{key}: {e.strerror or e}") from e

    def list(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
        # Walk only the directory that holds the prefix, then sort like S3 (byte order).
        base, _, _ = prefix.rpartition("/")
        top = self.root / base if base else self.root
        found: list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".tmp-")]
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if name.startswith(".tmp-"):
                    continue
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix) and key > start_after:
                    found.append(ObjectInfo(key, os.stat(os.path.join(dirpath, name)).st_size))
        yield from sorted(found, key=lambda o: o.key.encode())

    def delete_many(self, keys: Iterable[str]) -> None:
        for key in keys:
            try:
                self._path(key).unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                raise StoreError(f"{self.url}{key}: {e.strerror or e}") from e


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
