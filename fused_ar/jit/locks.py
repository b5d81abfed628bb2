"""Build and probe locks: one flock file per key in a private, node-local directory (FUSED_AR_LOCK_DIR).

flock is dropped by the kernel when its holder dies, so a killed builder blocks nobody. A lock directory
that is untrusted or unusable is reported once, at once, and work goes on unlocked (entries are written
atomically, so two builders of one key only duplicate work). It never decides what a lock protects.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from .. import env
from . import trust
from ..errors import CacheTrustError, FusedArError

_LOCK_NAME = re.compile(r"(?:probe-)?[0-9a-f]{24,64}\.lock")


class LockDir:
    def __init__(self, root: Path, timeout_s: float) -> None:
        self.root = Path(root)
        self.timeout_s = timeout_s
        self._unusable: Optional[str] = None
        self._checked = False

    def unusable(self) -> Optional[str]:
        """Why locks cannot be taken here (checked once: trusted, private, a file can be created), or None."""
        if not self._checked:
            self._checked = True
            try:
                trust.make_parents(self.root.parent, 0o700)
                with trust.opened_dir(self.root, create=True, mode=0o700) as fd:
                    probe = f".probe-{os.getpid()}-{os.urandom(4).hex()}"
                    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd))
                    os.unlink(probe, dir_fd=fd)
            except (OSError, CacheTrustError) as exc:
                self._unusable = str(exc)
                trust.warn_once(self.root, f"locks cannot be taken there ({exc}); processes may build the same "
                                           "kernel twice (entries stay consistent)")
        return self._unusable

    @contextmanager
    def held(self, name: str, what: str) -> Iterator[bool]:
        """Holds the lock `name` for the block; yields False (unlocked, warned once) where locks are unusable.
        Raises FusedArError naming the lock after the timeout."""
        if self.unusable() is not None:
            yield False
            return
        import filelock  # only a build or a probe takes a lock: a cache hit never imports it

        lock = filelock.FileLock(str(self.root / f"{name}.lock"), timeout=self.timeout_s)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise FusedArError(f"waited {self.timeout_s:.0f} s for another process {what} (lock {lock.lock_file}; "
                               f"raise {env.LOCK_TIMEOUT_S.name} or stop the hung process)") from None
        except OSError as exc:  # e.g. a symlink planted at the lock's name: never followed
            trust.warn_once(self.root / f"{name}.lock", f"cannot take the lock ({exc.strerror or exc}); going on unlocked")
            yield False
            return
        try:
            yield True
        finally:
            lock.release()

    def clear(self, keys: Optional[set[str]] = None) -> int:
        """Removes the lock files this library makes (key-named regular files; `keys` narrows them)."""
        removed = 0
        try:
            with trust.opened_dir(self.root) as fd:
                for name in trust.names_in(fd):
                    if _LOCK_NAME.fullmatch(name) and (keys is None or name.removesuffix(".lock") in keys):
                        removed += trust.unlink_regular(fd, name)
        except OSError:  # missing, another kind, untrusted (CacheTrustError): no lock of ours to remove
            pass
        return removed


def default_lock_dir() -> LockDir:
    return LockDir(env.lock_dir(), env.LOCK_TIMEOUT_S.get())
