"""What fused_ar trusts on disk, and how it reads and writes there: kernel cache entries, probe verdicts,
measured thresholds, lock files.

Every directory and file is opened without following a symlink and checked on its open descriptor: a
directory or a regular file (bounded in size), owned by an allowed user (the current one, by default),
writable by neither group nor others. A file that fails is a miss with one warning line naming it; a
directory that fails is a `CacheTrustError`. Writes go to an exclusive temp file in the same trusted
directory, are fsynced and renamed. This module knows nothing of what the files hold.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Collection, Iterator, Optional

from ..errors import CacheTrustError

log = logging.getLogger("fused_ar")

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC
# O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer (fstat refuses it).
_READ_FLAGS = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | _CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
_GROUP_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH

_warned: set[str] = set()


def me() -> frozenset[int]:
    return frozenset((os.getuid(),))


def warn_once(path: Path, why: str) -> None:
    """One line per (path, reason) per process, on the `fused_ar` logger."""
    line = f"fused_ar: ignoring {path}: {why}"
    if line not in _warned:
        _warned.add(line)
        log.warning(line)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"), (stat.S_ISLNK, "a symlink"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def problem(st: os.stat_result, want_dir: bool, owners: Collection[int], max_bytes: Optional[int] = None) -> Optional[str]:
    """Why an opened directory or file cannot be trusted, or None."""
    if want_dir != stat.S_ISDIR(st.st_mode) or (not want_dir and not stat.S_ISREG(st.st_mode)):
        return f"it is {_kind(st.st_mode)}, not {'a directory' if want_dir else 'a regular file'}"
    if st.st_uid not in owners:
        allowed = " or ".join(f"uid {u}" for u in sorted(owners))
        return f"it is owned by uid {st.st_uid}, not {allowed}"
    if st.st_mode & _GROUP_OTHER_WRITE:
        return f"it is writable by group or others ({stat.filemode(st.st_mode)})"
    if max_bytes is not None and st.st_size > max_bytes:
        return f"it holds {st.st_size} bytes, more than the {max_bytes} such a file may"
    return None


def _open_error(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "it is a symlink (fused_ar never follows one here)"
    if exc.errno == errno.ENOTDIR:
        return "it is not a directory"
    return exc.strerror or str(exc)


def _is_link(path: Path, dir_fd: Optional[int]) -> bool:
    try:
        return stat.S_ISLNK(os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


@contextmanager
def opened_dir(path: Path, dir_fd: Optional[int] = None, *, create: bool = False, mode: int = 0o700,
               owners: Optional[Collection[int]] = None) -> Iterator[int]:
    """A descriptor of the trusted directory `path` (relative to `dir_fd` when given), made with `mode`
    if `create` and missing. Raises CacheTrustError when untrusted (a symlink, another owner, writable by
    others), OSError when unusable (FileNotFoundError when missing, NotADirectoryError, ...)."""
    owners = me() if owners is None else owners
    if create:
        try:
            os.mkdir(path, mode, dir_fd=dir_fd)
        except FileExistsError:
            pass
    try:
        fd = os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        # O_DIRECTORY | O_NOFOLLOW on a symlink fails with ENOTDIR on Linux, ELOOP elsewhere
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and _is_link(path, dir_fd)):
            raise CacheTrustError(f"refusing directory {path}: it is a symlink (fused_ar never follows one "
                                  f"here; name the real directory)") from None
        raise  # missing, not a directory, no permission: unusable, not untrusted
    try:
        why = problem(os.fstat(fd), True, owners)
        if why is not None:
            raise CacheTrustError(f"refusing directory {path}: {why}; fused_ar keeps code and state only in a "
                                  f"directory owned by uid {os.getuid()} that group and others cannot write "
                                  f"(fix: chmod go-w, or use a private directory)")
        yield fd
    finally:
        os.close(fd)


def read_at(dir_fd: int, name: str, max_bytes: int, shown: Path,
            owners: Optional[Collection[int]] = None) -> Optional[bytes]:
    """The bytes of the trusted regular file `name` in `dir_fd`; None when it is missing or untrusted
    (then with one warning line naming `shown`, the path a user would recognize)."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        warn_once(shown, _open_error(exc))
        return None
    try:
        why = problem(os.fstat(fd), False, me() if owners is None else owners, max_bytes)
        if why is not None:
            warn_once(shown, why)
            return None
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:  # grew after fstat
            warn_once(shown, f"it holds more than the {max_bytes} bytes such a file may")
            return None
        return data
    except OSError as exc:
        warn_once(shown, exc.strerror or str(exc))
        return None
    finally:
        os.close(fd)


def write_at(dir_fd: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """Replaces `name` in `dir_fd` atomically: an exclusive, never-followed temp file in the same directory,
    fsynced, renamed over `name`, the directory fsynced. Raises OSError; leaves no temp file behind."""
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, _CREATE_FLAGS, mode, dir_fd=dir_fd)
    try:
        try:
            os.fchmod(fd, mode)  # the umask must not narrow what a shared layer's readers need
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    os.fsync(dir_fd)


def unlink_regular(dir_fd: int, name: str) -> bool:
    """Removes `name` from `dir_fd` if it is a regular file (a symlink, directory or device stays)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            return False
        os.unlink(name, dir_fd=dir_fd)
        return True
    except FileNotFoundError:
        return False


def names_in(dir_fd: int) -> list[str]:
    """The entry names of an opened directory, sorted (reads through the descriptor, never the path)."""
    dup = os.dup(dir_fd)  # scandir(fd) closes nothing, but rewinds; a private copy keeps callers' offsets
    try:
        with os.scandir(dup) as it:
            return sorted(entry.name for entry in it)
    finally:
        os.close(dup)


def is_dir_entry(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
