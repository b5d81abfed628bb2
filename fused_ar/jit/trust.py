"""What fused_ar trusts on disk, and how it reads and writes there: kernel cache entries, probe verdicts,
measured thresholds, layer manifests, lock files.

Every directory and file is opened without following a symlink and checked on its open descriptor: a
directory or a regular file (bounded in size), owned by an allowed user (the current one, by default),
writable by neither group nor others. `read_in` is the one way to read a file there: whatever is in the
way (missing, of another kind, unreadable, untrusted) makes it absent, with one warning line naming the
path unless it is simply missing; `json_in` does the same for JSON, of bounded nesting. Writes go to an
exclusive temp file in the same trusted directory, are fsynced and renamed. This module knows nothing of
what the files hold.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Collection, Iterator, Optional, Sequence

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


def warn_once(path: Path, why: str, then: str = "") -> None:
    """One line per (path, reason) per process, on the `fused_ar` logger; `then`: what follows from it."""
    line = f"fused_ar: ignoring {path}: {why}" + (f"; {then}" if then else "")
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


def open_error(exc: OSError) -> str:
    """Why opening failed, in words (a symlink is named as one)."""
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
    made = False
    if create:
        try:
            os.mkdir(path, mode, dir_fd=dir_fd)
            made = True
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
        if made:  # exactly `mode`, whatever the umask (a shared layer must stay readable, a private cache private)
            os.fchmod(fd, mode)
        why = problem(os.fstat(fd), True, owners)
        if why is not None:
            raise CacheTrustError(f"refusing directory {path}: {why}; fused_ar keeps code and state only in a "
                                  f"directory owned by uid {os.getuid()} that group and others cannot write "
                                  f"(fix: chmod go-w, or use a private directory)")
        yield fd
    finally:
        os.close(fd)


def read_at(dir_fd: int, name: str, max_bytes: int, shown: Path,
            owners: Optional[Collection[int]] = None, then: str = "") -> Optional[bytes]:
    """The bytes of the trusted regular file `name` in `dir_fd`; None when it is missing or untrusted
    (then with one warning line naming `shown`, the path a user would recognize)."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        warn_once(shown, open_error(exc), then)
        return None
    try:
        why = problem(os.fstat(fd), False, me() if owners is None else owners, max_bytes)
        if why is not None:
            warn_once(shown, why, then)
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
            warn_once(shown, f"it holds more than the {max_bytes} bytes such a file may", then)
            return None
        return data
    except OSError as exc:
        warn_once(shown, exc.strerror or str(exc), then)
        return None
    finally:
        os.close(fd)


def condition(path: Path, owners: Optional[Collection[int]] = None) -> str:
    """A directory's state in words, creating nothing: "ok", "missing", "untrusted: why" or "unusable: why"."""
    try:
        with opened_dir(path, owners=owners):
            return "ok"
    except FileNotFoundError:
        return "missing"
    except CacheTrustError as exc:
        return f"untrusted: {exc}"
    except OSError as exc:
        return f"unusable: {open_error(exc)}"


def make_parents(path: Path, mode: int) -> None:
    """Creates the missing directories above and including `path` with exactly `mode` (never the umask's
    choice: 0700 for a private cache, 0755 for a layer others read). Raises OSError."""
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            continue
        os.chmod(directory, mode, follow_symlinks=False)


def read_in(root: Path, parts: Sequence[str], max_bytes: int, owners: Optional[Collection[int]] = None,
            then: str = "") -> Optional[bytes]:
    """The bytes of the file root/parts[0]/.../parts[-1], every directory on the way and the file checked as
    above; None when anything is in the way: missing (silently), or of another kind, unreadable, untrusted
    (one warning line naming the path). Never raises for what is on disk."""
    at = Path(root)  # the directory being opened: what a warning names
    try:
        with ExitStack() as stack:
            fd = stack.enter_context(opened_dir(at, owners=owners))
            for name in parts[:-1]:
                at = at / name
                fd = stack.enter_context(opened_dir(Path(name), fd, owners=owners))
            return read_at(fd, parts[-1], max_bytes, Path(root, *parts), owners, then)
    except FileNotFoundError:
        return None
    except CacheTrustError as exc:
        warn_once(at, str(exc), then)
    except OSError as exc:
        warn_once(at, open_error(exc), then)
    return None


# State files hold flat records: a few levels of nesting at most. Deeper input is refused before parsing, so
# a planted file cannot make the parser recurse.
MAX_JSON_DEPTH = 16


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text (strings skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def parse_json(raw: bytes) -> tuple[Any, str]:
    """(value, "") or (None, why): not UTF-8, not JSON, or nested deeper than MAX_JSON_DEPTH."""
    if json_depth(raw) > MAX_JSON_DEPTH:
        return None, f"it nests deeper than {MAX_JSON_DEPTH} levels"
    try:
        return json.loads(raw.decode("utf-8")), ""
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return None, f"it is not JSON ({exc})"


def json_in(root: Path, parts: Sequence[str], max_bytes: int, owners: Optional[Collection[int]] = None,
            then: str = "") -> Any:
    """The JSON value of root/parts... read with read_in, or None (a malformed file: one warning line)."""
    raw = read_in(root, parts, max_bytes, owners, then)
    if raw is None:
        return None
    value, why = parse_json(raw)
    if why:
        warn_once(Path(root, *parts), why, then)
    return value


def write_at(dir_fd: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """Replaces `name` in `dir_fd` atomically: an exclusive, never-followed temp file in the same directory,
    fsynced, renamed over `name`, the directory fsynced. Raises OSError; leaves no temp file behind."""
    tmp = f".{name}.{os.urandom(6).hex()}.tmp"
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


def remove_entry(dir_fd: int, name: str) -> str:
    """Removes `name` from `dir_fd` when it is a regular file, or an empty directory planted under an entry's
    name; "" when done (or already gone), else why it stays (another kind, a directory with contents, a
    read-only disk). Never follows a symlink."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):
            os.unlink(name, dir_fd=dir_fd)
        elif stat.S_ISDIR(st.st_mode):
            os.rmdir(name, dir_fd=dir_fd)
        else:
            return f"it is {_kind(st.st_mode)}, left in place"
    except FileNotFoundError:
        return ""
    except OSError as exc:
        if exc.errno == errno.ENOTEMPTY:
            return "a directory with contents, left in place"
        return exc.strerror or str(exc)
    return ""


def unlink_regular(dir_fd: int, name: str) -> bool:
    """Removes `name` from `dir_fd` if it is a regular file (a symlink, directory or device stays); False when
    it is not one or cannot be removed (a read-only disk)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            return False
        os.unlink(name, dir_fd=dir_fd)
        return True
    except OSError:
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
