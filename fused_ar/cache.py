"""The disk cache of compiled kernels (DESIGN.md section 4): key, layout, atomic writes, locks, trust.

Wraps any `Compiler`: look, lock, look again, build. Entries are `<root>/<key[:2]>/<key>.bin` (code
object) and `<key>.json` (sidecar: spec, lowered names, compiler, options, digest); the sidecar is written
last and is the commit point. It never launches anything and never decides what to build.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Literal, Optional, Sequence

import filelock

from . import env
from ._version import __version__
from .compiler import CompiledKernel, Compiler, compiler_for
from .errors import CacheTrustError, FusedArError
from .render import Source, render
from .spec import KernelSpec

# Bump when the entry layout or the meaning of a key field changes: old entries then simply miss.
SCHEMA_VERSION = 1

Status = Literal["built", "cached"]


def cache_key(source_text: str, options: Sequence[str], arch: str, compiler_identity: str,
              version: str = __version__, schema: int = SCHEMA_VERSION) -> str:
    """SHA-256 over every input that shapes the code object's bytes; fields are length-prefixed."""
    h = hashlib.sha256()
    for part in (f"schema={schema}", f"version={version}", f"arch={arch}", f"compiler={compiler_identity}",
                 "options=" + "\x1f".join(options), source_text):
        data = part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def _digest(code: bytes) -> str:
    return hashlib.sha256(code).hexdigest()


def _check_trusted(path: Path) -> None:
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheTrustError(
            f"refusing to use {path}: owned by uid {st.st_uid} with mode {stat.filemode(st.st_mode)}; "
            f"code objects load only from a directory owned by uid {os.getuid()} and not writable by "
            f"group or others (fix: chmod go-w {path}, or set {env.CACHE_DIR.name} to a private directory)")


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@dataclass(frozen=True)
class Lookup:
    kernel: CompiledKernel
    key: str
    status: Status
    seconds: float


@dataclass(frozen=True)
class Entry:
    key: str
    meta_path: Path
    meta: dict


class KernelCache:
    """One cache directory. Create through `default_cache()` unless a test or tool needs its own root."""

    def __init__(self, root: Path, lock_root: Path, lock_timeout_s: float) -> None:
        self.root = Path(root)
        self.lock_root = Path(lock_root)
        self.lock_timeout_s = lock_timeout_s
        self._state: Optional[Literal["disk", "readonly", "memory"]] = None
        self._locks_usable: Optional[bool] = None
        self._memory: dict[str, CompiledKernel] = {}

    # -- directory state ---------------------------------------------------------------------------
    def _fallback(self, state: Literal["readonly", "memory"], why: str) -> None:
        self._state = state
        what = "compiled kernels are kept in memory only" if state == "memory" else "new kernels are not saved"
        warnings.warn(f"fused_ar kernel cache {self.root} is not writable ({why}): {what} for this process",
                      RuntimeWarning, stacklevel=4)

    def state(self) -> str:
        if self._state is None:
            try:
                self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:
                self._fallback("memory", str(exc))
                return self._state
            _check_trusted(self.root)
            if not os.access(self.root, os.W_OK):
                self._fallback("readonly", "permission denied")
            else:
                self._state = "disk"
        return self._state

    def _shard(self, key: str) -> Path:
        return self.root / key[:2]

    def paths(self, key: str) -> tuple[Path, Path]:
        shard = self._shard(key)
        return shard / f"{key}.bin", shard / f"{key}.json"

    # -- read / write ------------------------------------------------------------------------------
    def read(self, key: str) -> Optional[CompiledKernel]:
        """The verified entry for `key`, or None (absent, partial or corrupt entries are misses)."""
        if key in self._memory:
            return self._memory[key]
        if self.state() == "memory":
            return None
        bin_path, meta_path = self.paths(key)
        shard = self._shard(key)
        if shard.is_dir():
            _check_trusted(shard)
        try:
            meta = json.loads(meta_path.read_text())
            code = bin_path.read_bytes()
        except (OSError, ValueError):
            return None
        if meta.get("key") != key or meta.get("digest") != _digest(code):
            return None
        kernel = CompiledKernel(code, dict(meta["lowered_names"]), meta.get("log", ""), meta["compiler"],
                                tuple(meta["options"]), meta["arch"])
        self._memory[key] = kernel
        return kernel

    def write(self, key: str, kernel: CompiledKernel, spec: KernelSpec) -> None:
        self._memory[key] = kernel
        if self.state() != "disk":
            return
        bin_path, meta_path = self.paths(key)
        try:
            bin_path.parent.mkdir(exist_ok=True, mode=0o700)
        except OSError as exc:
            self._fallback("readonly", str(exc))
            return
        _check_trusted(bin_path.parent)
        try:
            _atomic_write(bin_path, kernel.code)
            meta = {"key": key, "schema": SCHEMA_VERSION, "version": __version__, "spec": spec.to_dict(),
                    "lowered_names": kernel.lowered_names, "compiler": kernel.compiler,
                    "options": list(kernel.options), "arch": kernel.arch, "digest": _digest(kernel.code),
                    "size": len(kernel.code), "log": kernel.log, "created": time.time()}
            _atomic_write(meta_path, json.dumps(meta, indent=1, sort_keys=True).encode())
        except OSError as exc:  # disk full, directory turned read-only: keep serving from memory
            self._fallback("readonly", str(exc))

    # -- locking -----------------------------------------------------------------------------------
    def _lock(self, key: str) -> Optional[filelock.BaseFileLock]:
        if self._locks_usable is None:
            try:
                self.lock_root.mkdir(parents=True, exist_ok=True, mode=0o700)
                _check_trusted(self.lock_root)
                self._locks_usable = os.access(self.lock_root, os.W_OK)
            except OSError:
                self._locks_usable = False
            if not self._locks_usable:
                warnings.warn(f"fused_ar lock directory {self.lock_root} is unusable: processes may build the "
                              "same kernel twice (entries stay consistent)", RuntimeWarning, stacklevel=4)
        if not self._locks_usable:
            return None
        # flock-based: the kernel drops it when the holder dies, so a killed builder blocks nobody.
        return filelock.FileLock(str(self.lock_root / f"{key}.lock"), timeout=self.lock_timeout_s)

    # -- the double-checked build ------------------------------------------------------------------
    def compile_cached(self, source: Source, compiler: Compiler, arch: str) -> Lookup:
        start = time.perf_counter()
        key = cache_key(source.text, compiler.options(arch), arch, compiler.identity())
        kernel = self.read(key)
        if kernel is not None:
            return Lookup(kernel, key, "cached", time.perf_counter() - start)
        lock = None if self.state() == "memory" else self._lock(key)
        try:
            if lock is not None:
                lock.acquire()
        except filelock.Timeout:
            raise FusedArError(f"waited {self.lock_timeout_s:.0f} s for another process building {source.spec} "
                               f"(lock {lock.lock_file}; raise {env.LOCK_TIMEOUT_S.name} or remove a hung "
                               "builder)") from None
        try:
            kernel = self.read(key)
            if kernel is not None:
                return Lookup(kernel, key, "cached", time.perf_counter() - start)
            kernel = compiler.compile(source, arch)
            self.write(key, kernel, source.spec)
            return Lookup(kernel, key, "built", time.perf_counter() - start)
        finally:
            if lock is not None:
                lock.release()

    def get(self, spec: KernelSpec, compiler: Optional[Compiler] = None) -> Lookup:
        return self.compile_cached(render(spec), compiler or compiler_for(spec.arch), spec.arch)

    # -- maintenance (cache info | clear | verify) ----------------------------------------------------
    def entries(self) -> Iterator[Entry]:
        if not self.root.is_dir():
            return
        for meta_path in sorted(self.root.glob("??/*.json")):
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                meta = {}
            yield Entry(meta_path.stem, meta_path, meta)

    def verify(self) -> tuple[int, list[str]]:
        """(good entries, keys of entries whose code object is missing or does not match its digest)."""
        self._memory.clear()
        good, bad = 0, []
        for entry in self.entries():
            if self.read(entry.key) is None:
                bad.append(entry.key)
            else:
                good += 1
        return good, bad

    def clear(self) -> int:
        """Removes every entry (and stray temp files of killed writers); returns the entries removed."""
        removed = sum(1 for _ in self.entries())
        if self.root.is_dir():
            for path in self.root.glob("??/*"):
                if path.suffix in (".bin", ".json", ".tmp"):
                    path.unlink(missing_ok=True)
            for shard in self.root.glob("??"):
                try:
                    shard.rmdir()
                except OSError:
                    pass
        self._memory.clear()
        return removed


@lru_cache(maxsize=None)
def _cache_at(root: Path, lock_root: Path, lock_timeout_s: float) -> KernelCache:
    return KernelCache(root, lock_root, lock_timeout_s)


def default_cache() -> KernelCache:
    """The cache the environment selects (FUSED_AR_CACHE_DIR etc.), one object per directory per process."""
    return _cache_at(env.cache_dir(), env.lock_dir(), env.LOCK_TIMEOUT_S.get())
