"""A store in a local directory: the embedded default, no S3 needed.

Creates are ``link(2)`` (fails on an existing name); a conditional replace compares
the object's etag and renames under an ``flock`` on a sibling ``.lock-<name>`` file,
which unconditional replaces and deletes of that key also take.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from syncd.errors import AlreadyExists, NoSuchStore, NotFound, PreconditionFailed, StoreError
from syncd.private import private_dir
from syncd.store.base import ObjectInfo, check_key

_HIDDEN = (".tmp-", ".lock-")


def _order(name: str) -> bytes:
    """S3's order (bytes), for any name a directory holds: one that is not UTF-8 (no
    writer makes it; a reader skips it) comes as ``os`` decoded it, with surrogates."""
    return name.encode(errors="surrogateescape")


def _etag(st: os.stat_result) -> str:
    # Every write is a new inode (temp file, then link or rename); with the mtime and
    # size this changes on every write, without reading the object.
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


class LocalStore:
    def __init__(self, root: Path, *, create: bool = True) -> None:
        self.root = root
        self.url = root.as_uri() + "/"
        if not create:
            try:
                st = root.stat()
            except FileNotFoundError:
                raise NoSuchStore(f"store {root.as_uri()} does not exist") from None
            except OSError as e:
                raise StoreError(f"{self.url}: {e.strerror}") from e
            if not stat.S_ISDIR(st.st_mode):
                raise NoSuchStore(f"store {root.as_uri()} is not a directory")
            return
        try:
            private_dir(root)
        except OSError as e:
            raise StoreError(f"{self.url}: cannot create store directory: {e.strerror}") from e

    def _path(self, key: str) -> Path:
        path = self.root / check_key(key)
        if path.name.startswith(_HIDDEN):
            raise StoreError(f"{self.url}{key}: names starting with .tmp- or .lock- are reserved")
        return path

    @contextlib.contextmanager
    def _locked(self, path: Path, create: bool = True) -> Iterator[None]:
        """Hold the key's lock (when ``create`` is false, only if it was ever made)."""
        lock = path.with_name(".lock-" + path.name)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o600)
        except FileNotFoundError:
            if create:
                raise
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def put(self, key: str, data: bytes, *, if_none_match: bool = True,
            if_match: str | None = None) -> str:
        path = self._path(key)
        try:
            private_dir(path.parent)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        except OSError as e:
            raise StoreError(f"{self.url}{key}: {e.strerror}") from e
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
                etag = _etag(os.fstat(f.fileno()))
            if if_match is not None:
                with self._locked(path):
                    try:
                        current = _etag(path.stat())
                    except FileNotFoundError:
                        raise PreconditionFailed(f"{self.url}{key}: does not exist "
                                                 "(conditional replace)") from None
                    if current != if_match:
                        raise PreconditionFailed(f"{self.url}{key}: changed since it was read "
                                                 "(etag mismatch)")
                    os.replace(tmp, path)
            elif if_none_match:
                # link() fails with EEXIST instead of replacing: an atomic create-if-absent.
                os.link(tmp, path)
            else:
                with self._locked(path, create=False):
                    os.replace(tmp, path)
            _fsync_dir(path.parent)
            return etag
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
            # Objects are regular files: a symlink or a pipe planted in a shared directory
            # is refused, never followed or read (a pipe would block, /dev/zero never end).
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            with open(fd, "rb") as f:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise StoreError(f"{self.url}{key}: not a regular file (refusing it)")
                f.seek(max(0, st.st_size + start) if start < 0 else start)
                return f.read() if length is None else f.read(length)
        except FileNotFoundError:
            raise NotFound(f"{self.url}{key}: not found") from None
        except OSError as e:
            raise StoreError(f"{self.url}{key}: {e.strerror or e}") from e
        except (ValueError, OverflowError):  # an offset no file has (as S3 refuses a range)
            raise StoreError(f"{self.url}{key}: cannot read {length} bytes at offset "
                             f"{start}") from None

    def head(self, key: str) -> ObjectInfo | None:
        try:
            st = os.lstat(self._path(key))
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StoreError(f"{self.url}{key}: {e.strerror or e}") from e
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{self.url}{key}: not a regular file (refusing it)")
        return ObjectInfo(key, st.st_size, _etag(st))

    def list(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
        # Walk only the directory that holds the prefix, then sort like S3 (byte order).
        base, _, _ = prefix.rpartition("/")
        top = self.root / base if base else self.root
        found: list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".tmp-")]
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if name.startswith(_HIDDEN):
                    continue
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix) and key > start_after:
                    try:
                        st = os.lstat(os.path.join(dirpath, name))
                    except FileNotFoundError:
                        continue  # deleted while we listed
                    if stat.S_ISREG(st.st_mode):  # no writer makes anything else
                        found.append(ObjectInfo(key, st.st_size, _etag(st)))
        yield from sorted(found, key=lambda o: _order(o.key))

    def prefixes(self, prefix: str) -> Iterator[str]:
        # A directory is a prefix when a key lies below it (S3 has no empty ones).
        base, _, part = prefix.rpartition("/")
        top = self.root / base if base else self.root
        try:
            names = [e.name for e in os.scandir(top) if e.name.startswith(part)
                     and not e.name.startswith(_HIDDEN) and e.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            return
        for name in sorted(names, key=_order):
            if any(not f.startswith(_HIDDEN) and _regular(os.path.join(d, f))
                   for d, _, files in os.walk(top / name) for f in files):
                yield f"{base}/{name}/" if base else f"{name}/"

    def delete_many(self, keys: Iterable[str]) -> None:
        for key in keys:
            path = self._path(key)
            try:
                with self._locked(path, create=False):
                    path.unlink()
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


def _regular(path: str) -> bool:
    """A regular file, as ``list`` yields (no writer makes anything else)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False
