"""The disk cache of compiled kernels: key, layout, sidecar schema, atomic writes, locks, trust.

Wraps any `Compiler`: look, lock, look again, build. Entries are `<root>/<key[:2]>/<key>.bin` (code
object) and `<key>.json` (sidecar: spec, lowered names, compiler, options, digest); the sidecar is written
last and is the commit point. Every file is read through `trust` (no symlinks, regular, owned, bounded);
a malformed or foreign entry is a miss. It never launches anything and never decides what to build.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Optional, Sequence

from .. import env
from . import trust
from .._version import __version__
from .compiler import CompiledKernel, Compiler
from ..errors import CacheTrustError, ConfigError
from .locks import LockDir
from .render import Source, render
from .spec import KernelSpec

# Bump when the entry layout or the meaning of a key field changes: old entries then simply miss.
SCHEMA_VERSION = 1
# Bounds on what is read from disk: a sidecar is a few hundred bytes plus the log kept in it; the
# largest code object the matrix makes is ~60 KiB (fp32 CUBIN).
SIDECAR_MAX_BYTES = 16 << 10
LOG_KEEP_CHARS = 8 << 10
CODE_MAX_BYTES = 16 << 20
_WRITE_ATTEMPTS = 3

Status = Literal["built", "cached"]

_KEY = re.compile(r"[0-9a-f]{64}")
# Write failures that concern the whole directory (every later write would fail too); others concern one
# entry's place only.
_DIRECTORY_WIDE = frozenset((errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EIO))
_SHARD = re.compile(r"[0-9a-f]{2}")
_ENTRY_FILE = re.compile(r"([0-9a-f]{64})\.(bin|json)")
_TEMP_FILE = re.compile(r"\.([0-9a-f]{64})\.(bin|json)\.[0-9a-f]+\.tmp")
# What else the library keeps in a cache directory (fused_ar.comm.probe, fused_ar.comm.thresholds), and the manifest
# of a read-only layer (`warm --into`).
STATE_DIRS = ("probes", "thresholds")
LAYER_MANIFEST = "layer.json"
MANIFEST_MAX_BYTES = 64 << 10


def cache_key(source_text: str, options: Sequence[str], arch: str, compiler_identity: str,
              version: Optional[str] = None, schema: int = SCHEMA_VERSION) -> str:
    """SHA-256 over every input that shapes the code object's bytes (`version`: this package's by default);
    fields are length-prefixed."""
    version = __version__ if version is None else version
    h = hashlib.sha256()
    for part in (f"schema={schema}", f"version={version}", f"arch={arch}", f"compiler={compiler_identity}",
                 "options=" + "\x1f".join(options), source_text):
        data = part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def _digest(code: bytes) -> str:
    return hashlib.sha256(code).hexdigest()


_SIDECAR_FIELDS: dict[str, Any] = {"key": str, "schema": int, "version": str, "spec": dict, "lowered_names": dict,
                                   "compiler": str, "options": list, "arch": str, "digest": str, "size": int,
                                   "log": str, "created": (int, float)}


def parse_sidecar(raw: bytes, key: str, code: Optional[bytes], spec: Optional[KernelSpec] = None) -> tuple[Optional[dict], str]:
    """(sidecar, "") when `raw` is a well-formed sidecar of `key` (for `spec`, matching `code`), else (None, why)."""
    meta, why = trust.parse_json(raw)
    if why:
        return None, f"its sidecar: {why}"
    if not isinstance(meta, dict):
        return None, f"its sidecar is a JSON {type(meta).__name__}, not an object"
    for name, kind in _SIDECAR_FIELDS.items():
        if name not in meta:
            return None, f"its sidecar has no field {name!r}"
        if not isinstance(meta[name], kind) or isinstance(meta[name], bool):
            return None, f"its sidecar's {name!r} is {type(meta[name]).__name__}"
    if meta["key"] != key or meta["schema"] != SCHEMA_VERSION:
        return None, f"its sidecar describes key {meta['key'][:16]}... schema {meta['schema']}"
    try:
        stored = KernelSpec.from_dict(meta["spec"])
    except (TypeError, ValueError) as exc:
        return None, f"its sidecar's spec is invalid ({exc})"
    if spec is not None and stored != spec:
        return None, f"its sidecar is for {stored}, not {spec}"
    names = meta["lowered_names"]
    if not all(isinstance(k, str) and isinstance(v, str) and v for k, v in names.items()) \
            or stored.kernel_name not in names or not all(isinstance(o, str) for o in meta["options"]):
        return None, f"its sidecar's lowered names or options are malformed (kernel {stored.kernel_name})"
    if code is not None and (meta["digest"] != _digest(code) or meta["size"] != len(code)):
        return None, "its code object does not match the sidecar's digest"
    return meta, ""


def _sidecar(key: str, kernel: CompiledKernel, spec: KernelSpec) -> bytes:
    meta = {"key": key, "schema": SCHEMA_VERSION, "version": __version__, "spec": spec.to_dict(),
            "lowered_names": kernel.lowered_names, "compiler": kernel.compiler, "options": list(kernel.options),
            "arch": kernel.arch, "digest": _digest(kernel.code), "size": len(kernel.code),
            "log": kernel.log[:LOG_KEEP_CHARS], "created": time.time()}
    return json.dumps(meta, indent=1, sort_keys=True).encode()


@dataclass(frozen=True)
class Lookup:
    """What KernelCache.get found or built for one spec: the kernel, its key, how it came (Status), how long."""

    kernel: CompiledKernel
    key: str
    status: Status
    seconds: float
    saved: bool = True  # False: built, but kept in memory only (the cache directory could not take it)
    source: str = "cache"  # where a cached entry came from: "cache" (the writable directory), a layer's path


@dataclass(frozen=True)
class Entry:
    """One key found in a cache directory: its sidecar when well-formed, else what is wrong with it."""

    key: str
    path: Path
    meta: Optional[dict]
    problem: str = ""


def check_root(root: Path) -> None:
    """Refuses a cache directory that is `/`, the home directory, or a directory of other programs' files."""
    resolved = Path(os.path.abspath(root))
    if resolved == Path("/") or resolved == Path(os.path.abspath(Path.home())):
        raise CacheTrustError(f"refusing cache directory {root}: it is {resolved} itself; give fused_ar a "
                              f"directory of its own (the default is ~/.cache/fused_ar)")


def _foreign(names: Sequence[str]) -> list[str]:
    return [n for n in names if not (_SHARD.fullmatch(n) or n in STATE_DIRS or n == LAYER_MANIFEST)]


class CacheDir:
    """One directory of entries, trusted when owned by one of `owners` and writable by nobody else. A
    directory others read (a layer built by `warm --into`) is made with `shared`: 0755 directories and
    0644 files instead of 0700 and 0600."""

    def __init__(self, root: Path, owners: Optional[frozenset[int]] = None, shared: bool = False,
                 writable: bool = True) -> None:
        self.root = Path(root)
        self.owners = trust.me() if owners is None else owners
        self.dir_mode, self.file_mode = (0o755, 0o644) if shared else (0o700, 0o600)
        self.writable = writable  # False: a read-only layer, never created, written, locked or cleared
        self._state: Optional[Literal["disk", "readonly", "memory"]] = None

    def _fallback(self, state: Literal["readonly", "memory"], why: str) -> None:
        self._state = state
        what = "compiled kernels are kept in memory only" if state == "memory" else "new kernels are not saved"
        warnings.warn(f"fused_ar kernel cache {self.root} is not writable ({why}): {what} for this process",
                      RuntimeWarning, stacklevel=5)

    def state(self, create: bool = True) -> str:
        """disk | readonly | memory (| absent, when not `create` and the directory does not exist).
        Raises CacheTrustError for a directory fused_ar must not use."""
        if self._state is not None:
            return self._state
        check_root(self.root)
        create = create and self.writable
        try:
            if create:
                trust.make_parents(self.root.parent, self.dir_mode)
            with trust.opened_dir(self.root, create=create, mode=self.dir_mode, owners=self.owners) as fd:
                foreign = _foreign(trust.names_in(fd))
        except CacheTrustError:
            raise
        except OSError as exc:
            if not create:  # only looking: nothing to read here, and nothing to warn about yet
                return "absent"
            self._fallback("memory", exc.strerror or str(exc))
            return self._state
        if foreign:
            raise CacheTrustError(f"refusing cache directory {self.root}: it holds files that are not fused_ar's "
                                  f"({', '.join(repr(n) for n in foreign[:3])}{', ...' if len(foreign) > 3 else ''}); "
                                  f"give fused_ar a directory of its own")
        if not self.writable:
            self._state = "readonly"
        elif os.access(self.root, os.W_OK):
            self._state = "disk"
        else:
            self._fallback("readonly", "permission denied")
        return self._state

    def condition(self) -> str:
        """This directory's state in words, for `info` and `cache info`, creating nothing: ok (writable or
        read-only), missing (made on first build, or why it cannot be), untrusted or unusable (and why)."""
        try:
            check_root(self.root)
            with trust.opened_dir(self.root, owners=self.owners) as fd:
                foreign = _foreign(trust.names_in(fd))
        except CacheTrustError as exc:
            return f"untrusted: {exc}"
        except FileNotFoundError:
            if not self.writable:
                return "missing"
            ancestor = self.root.parent
            while not os.path.lexists(ancestor):
                ancestor = ancestor.parent
            import tempfile

            try:  # what mkdir would say (access() says yes to root everywhere, /proc included)
                os.rmdir(tempfile.mkdtemp(prefix=".fused_ar-probe-", dir=ancestor))
            except OSError as exc:
                return f"missing, and it cannot be made: {ancestor} takes no new directory ({exc.strerror or exc})"
            return "missing: made at the first build"
        except OSError as exc:
            return f"unusable: {trust.open_error(exc)}"
        if foreign:
            return f"untrusted: it holds files that are not fused_ar's ({', '.join(repr(n) for n in foreign[:3])})"
        if not self.writable:
            return "ok (read-only layer)"
        return "ok, writable" if os.access(self.root, os.W_OK) else "ok, but not writable: new kernels are not saved"

    def paths(self, key: str) -> tuple[Path, Path]:
        shard = self.root / key[:2]
        return shard / f"{key}.bin", shard / f"{key}.json"

    def read(self, key: str, spec: Optional[KernelSpec] = None) -> Optional[CompiledKernel]:
        """The verified entry for `key`, or None: absent, partial, malformed, foreign or corrupt entries miss."""
        if not _KEY.fullmatch(key) or self.state(create=False) in ("memory", "absent"):
            return None
        bin_path, meta_path = self.paths(key)
        # anything in the way (missing, another kind, unreadable, untrusted) is a miss, said once
        raw = trust.read_in(self.root, (key[:2], meta_path.name), SIDECAR_MAX_BYTES, self.owners, "a miss")
        code = raw and trust.read_in(self.root, (key[:2], bin_path.name), CODE_MAX_BYTES, self.owners, "a miss")
        if not raw or not code:
            return None
        meta, why = parse_sidecar(raw, key, code, spec)
        if meta is None:
            trust.warn_once(meta_path, why + " (a miss)")
            return None
        return CompiledKernel(code, dict(meta["lowered_names"]), meta["log"], meta["compiler"], tuple(meta["options"]),
                              meta["arch"])

    def write(self, key: str, kernel: CompiledKernel, spec: KernelSpec) -> bool:
        """Stores the entry (code object first, sidecar last); False when the directory cannot take it."""
        file_mode, dir_mode = self.file_mode, self.dir_mode
        if not self.writable or self.state() != "disk":
            return False
        for attempt in range(_WRITE_ATTEMPTS):
            try:
                with trust.opened_dir(self.root, owners=self.owners) as root_fd, \
                        trust.opened_dir(key[:2], root_fd, create=True, mode=dir_mode, owners=self.owners) as shard_fd:
                    trust.write_at(shard_fd, f"{key}.bin", kernel.code, file_mode)
                    trust.write_at(shard_fd, f"{key}.json", _sidecar(key, kernel, spec), file_mode)
                return True
            except CacheTrustError as exc:  # a planted shard: this entry only
                trust.warn_once(self.root / key[:2], f"{exc}; kernels of this shard are kept in memory")
                return False
            except FileNotFoundError:  # `cache clear` removed the shard between its mkdir and open: again
                continue
            except OSError as exc:
                if exc.errno in _DIRECTORY_WIDE:  # the disk or the directory: keep serving from memory
                    self._fallback("readonly", exc.strerror or str(exc))
                else:  # something of another kind where this entry goes (a directory named like it): it only
                    trust.warn_once(self.root / key[:2] / f"{key}.bin", f"{exc.strerror or exc}; this kernel is "
                                    "kept in memory")
                return False
        return False

    def _shards(self) -> Iterator[tuple[str, Optional[int], list[str], str]]:
        """(shard name, descriptor, entry names, "") of each shard directory, or (name, None, [], why) for one
        that cannot be used (another kind of file, unreadable, untrusted)."""
        try:
            with trust.opened_dir(self.root, owners=self.owners) as root_fd:
                for shard in trust.names_in(root_fd):
                    if not _SHARD.fullmatch(shard):
                        continue
                    try:
                        with trust.opened_dir(shard, root_fd, owners=self.owners) as fd:
                            yield shard, fd, trust.names_in(fd), ""
                    except FileNotFoundError:
                        continue
                    except CacheTrustError as exc:
                        yield shard, None, [], str(exc)
                    except OSError as exc:
                        yield shard, None, [], f"shard {self.root / shard}: {trust.open_error(exc)}"
        except FileNotFoundError:
            return

    def entries(self) -> Iterator[Entry]:
        """Every key with a sidecar or a code object, checked as `read` checks it (an orphan code object is
        an entry with a problem; so is a shard that is not a usable directory, under its own name)."""
        for shard, fd, names, problem in self._shards():
            if fd is None:
                yield Entry(shard, self.root / shard, None, problem)
                continue
            keys = sorted({m.group(1) for m in map(_ENTRY_FILE.fullmatch, names) if m and m.group(1)[:2] == shard})
            for key in keys:
                bin_path, meta_path = self.paths(key)
                raw = trust.read_at(fd, meta_path.name, SIDECAR_MAX_BYTES, meta_path, self.owners)
                if raw is None:
                    what = "a code object with no sidecar (an orphan)" if bin_path.name in names else "no valid sidecar"
                    yield Entry(key, meta_path, None, what)
                    continue
                code = trust.read_at(fd, bin_path.name, CODE_MAX_BYTES, bin_path, self.owners)
                meta, why = parse_sidecar(raw, key, code, None)
                if code is None:
                    why = "its code object is missing, not a regular file, or untrusted"
                yield Entry(key, meta_path, meta if code is not None else None, why)

    def clear(self) -> tuple[list[str], list[str]]:
        """Removes the key-named regular files (and stray temp files of killed writers) of every trusted shard,
        and empty directories planted under such names, never through a symlink. Returns (the keys removed,
        one line for each thing that had to stay: a read-only disk, a directory with contents, ...)."""
        removed: set[str] = set()
        left: list[str] = []
        try:
            with trust.opened_dir(self.root, owners=self.owners) as root_fd:
                for shard in trust.names_in(root_fd):
                    if not _SHARD.fullmatch(shard) or not trust.is_dir_entry(root_fd, shard):
                        continue
                    try:
                        with trust.opened_dir(shard, root_fd, owners=self.owners) as fd:
                            for name in trust.names_in(fd):
                                entry, temp = _ENTRY_FILE.fullmatch(name), _TEMP_FILE.fullmatch(name)
                                match = entry or temp
                                if not match or match.group(1)[:2] != shard:
                                    continue
                                why = trust.remove_entry(fd, name)
                                if why:
                                    left.append(f"{self.root / shard / name}: {why}")
                                elif entry:
                                    removed.add(match.group(1))
                    except FileNotFoundError:
                        continue
                    except CacheTrustError as exc:
                        left.append(f"{self.root / shard}: {exc}")
                        continue
                    except OSError as exc:
                        left.append(f"{self.root / shard}: {trust.open_error(exc)}")
                        continue
                    try:
                        os.rmdir(shard, dir_fd=root_fd)
                    except OSError:
                        pass  # not empty: something that is not ours stays, untouched
        except FileNotFoundError:
            pass
        return sorted(removed), left


def layer_owners() -> frozenset[int]:
    """Who may own a read-only layer and its files: root (an image built as root) or the current user."""
    return frozenset((0, os.getuid()))


class KernelCache:
    """The writable cache directory, read-only layers below it and the build locks. Lookups read memory,
    then the writable directory, then each layer in order; builds write the writable directory only.
    Create through `default_cache()` unless a test or tool needs its own root."""

    def __init__(self, root: Path, lock_root: Path, lock_timeout_s: float, layers: Sequence[Path] = (),
                 shared: bool = False) -> None:
        lock_root = Path(lock_root)
        refused_anyway = Path(os.path.abspath(root)) in (Path("/"), Path(os.path.abspath(Path.home())))  # check_root
        if not refused_anyway and (lock_root == Path(root) or Path(root) in lock_root.parents):
            raise ConfigError(f"lock directory {lock_root} lies inside the cache directory {root}: the cache holds "
                              f"only its entries; give the locks a directory of their own ({env.LOCK_DIR.name}, "
                              "node-local)")
        self.dir = CacheDir(root, shared=shared)
        self.layers = [CacheDir(p, owners=layer_owners(), writable=False) for p in layers]
        self.configured_layers = tuple(self.layers)  # `layers` drops one refused at a lookup; this keeps all
        self.locks = LockDir(lock_root, lock_timeout_s)
        self._memory: dict[str, tuple[CompiledKernel, str]] = {}

    @property
    def root(self) -> Path:
        return self.dir.root

    @property
    def lock_root(self) -> Path:
        return self.locks.root

    @property
    def lock_timeout_s(self) -> float:
        return self.locks.timeout_s

    def state(self, create: bool = True) -> str:
        return self.dir.state(create)

    def paths(self, key: str) -> tuple[Path, Path]:
        return self.dir.paths(key)

    def find(self, key: str, spec: Optional[KernelSpec] = None) -> tuple[Optional[CompiledKernel], str]:
        """(the entry for `key`, where it came from: "cache", a layer's path, or "" when nowhere)."""
        hit = self._memory.get(key)
        if hit is not None:
            return hit
        kernel, source = self.dir.read(key, spec), "cache"
        for layer in list(self.layers) if kernel is None else ():
            try:
                kernel = layer.read(key, spec)
            except CacheTrustError as exc:  # refused once, with the reason; the other layers still serve
                trust.warn_once(layer.root, f"{exc}; this cache layer is not used")
                self.layers.remove(layer)
                continue
            if kernel is not None:
                source = str(layer.root)
                break
        if kernel is None:
            return None, ""
        self._memory[key] = (kernel, source)
        return kernel, source

    def read(self, key: str, spec: Optional[KernelSpec] = None) -> Optional[CompiledKernel]:
        return self.find(key, spec)[0]

    def write(self, key: str, kernel: CompiledKernel, spec: KernelSpec) -> bool:
        self._memory[key] = (kernel, "cache")
        return self.dir.write(key, kernel, spec)

    # -- the double-checked build ------------------------------------------------------------------
    def compile_cached(self, source: Source, compiler: Compiler, arch: str) -> Lookup:
        start = time.perf_counter()
        key = cache_key(source.text, compiler.options(arch), arch, compiler.identity())
        kernel, where = self.find(key, source.spec)
        if kernel is not None:
            return Lookup(kernel, key, "cached", time.perf_counter() - start, source=where)
        if self.state() == "memory":
            kernel = compiler.compile(source, arch)
            self._memory[key] = (kernel, "memory")
            return Lookup(kernel, key, "built", time.perf_counter() - start, saved=False, source="memory")
        with self.locks.held(key, f"building {source.spec}"):
            kernel, where = self.find(key, source.spec)
            if kernel is not None:
                return Lookup(kernel, key, "cached", time.perf_counter() - start, source=where)
            kernel = compiler.compile(source, arch)
            saved = self.write(key, kernel, source.spec)
            return Lookup(kernel, key, "built", time.perf_counter() - start, saved)

    def get(self, spec: KernelSpec, compiler: Compiler) -> Lookup:
        """`spec`'s kernel, built by `compiler` (the backend's, fused_ar.backends.compiler_for) on a miss."""
        return self.compile_cached(render(spec), compiler, spec.arch)

    # -- maintenance (cache info | clear | verify) ----------------------------------------------------
    def entries(self) -> Iterator[Entry]:
        if self.state(create=False) in ("memory", "absent"):
            return iter(())
        return self.dir.entries()

    def verify(self) -> tuple[int, list[Entry]]:
        """(good entries, the bad ones: orphan, malformed, foreign or corrupt, each with its problem)."""
        self._memory.clear()
        good, bad = 0, []
        for entry in self.entries():
            if entry.meta is None or entry.problem:
                bad.append(entry)
            else:
                good += 1
        return good, bad

    def clear(self) -> tuple[int, list[str]]:
        """Removes every entry, stray temp files and the build locks of this cache; returns (the entries
        removed, one line per thing that had to stay and why)."""
        self._memory.clear()
        if self.state(create=False) in ("memory", "absent"):
            return 0, []
        removed, left = self.dir.clear()
        self.locks.clear()
        return len(removed), left


@lru_cache(maxsize=None)
def _cache_at(root: Path, lock_root: Path, lock_timeout_s: float, layers: tuple[Path, ...]) -> KernelCache:
    return KernelCache(root, lock_root, lock_timeout_s, layers)


def default_cache() -> KernelCache:
    """The cache the environment selects (FUSED_AR_CACHE_DIR, FUSED_AR_CACHE_PATH etc.), one object per
    configuration per process."""
    return _cache_at(env.cache_dir(), env.lock_dir(), env.LOCK_TIMEOUT_S.get(), tuple(env.CACHE_PATH.get()))


# -- read-only layers: what `warm --into` records, what `info` compares -----------------------------------
MANIFEST_FORMAT = 1


def write_manifest(root: Path, compilers: dict[str, str], kernels: int) -> None:
    """Records in a layer what its entries were built with (the key already holds it; this says it)."""
    manifest = {"format": MANIFEST_FORMAT, "version": __version__, "schema": SCHEMA_VERSION,
                "compilers": compilers, "kernels": kernels, "created": time.time()}
    with trust.opened_dir(root) as fd:
        trust.write_at(fd, LAYER_MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode(), 0o644)


def read_manifest(root: Path, owners: Optional[frozenset[int]] = None) -> Optional[dict]:
    """A layer's manifest, or None (none, untrusted or malformed: then the layer is judged by its entries)."""
    owners = layer_owners() if owners is None else owners
    manifest = trust.json_in(Path(root), (LAYER_MANIFEST,), MANIFEST_MAX_BYTES, owners)
    ok = isinstance(manifest, dict) and isinstance(manifest.get("version"), str) and \
        isinstance(manifest.get("compilers"), dict)
    return manifest if ok else None


def why_layer_misses(manifest: Optional[dict], arch: str, identity: str) -> str:
    """Why a layer holds no entry for keys made here, from its manifest."""
    if manifest is None:
        return "the layer has no readable manifest"
    if manifest["version"] != __version__:
        return f"built by fused_ar {manifest['version']}, this is {__version__}"
    built = manifest["compilers"].get(arch)
    if built is None:
        return f"built for {', '.join(sorted(manifest['compilers'])) or 'no arch'}, not {arch}"
    if built != identity:
        return f"built with compiler {built}, here it is {identity}"
    return "the layer lacks these kernels"


def coverage(cache: KernelCache, specs: Sequence[KernelSpec],
             compiler_for: Callable[[str], Compiler]) -> list[tuple[KernelSpec, str]]:
    """Where each spec's kernel would come from now ("cache", a layer's path, or "" for a build)."""
    found = []
    for spec in specs:
        compiler = compiler_for(spec.arch)
        key = cache_key(render(spec).text, compiler.options(spec.arch), spec.arch, compiler.identity())
        found.append((spec, cache.find(key, spec)[1]))
    return found


@contextmanager
def state_dir(name: str, create: bool = False) -> Iterator[tuple[int, Path]]:
    """(descriptor, path) of the trusted subdirectory `name` of the cache directory, where the library keeps
    state files (fused_ar.comm.probe's verdicts, fused_ar.comm.thresholds). Raises FileNotFoundError when it does not
    exist (or the cache lives in memory only), CacheTrustError when it must not be used."""
    if name not in STATE_DIRS:
        raise ValueError(f"unknown state directory {name!r}")
    cache = default_cache()
    if cache.state(create=create) in ("memory", "absent"):
        raise FileNotFoundError(f"{cache.root} is not usable")
    with trust.opened_dir(cache.root) as root_fd, trust.opened_dir(name, root_fd, create=create) as fd:
        yield fd, cache.root / name
