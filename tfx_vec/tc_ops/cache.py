"""tc_ops' on-disk caches: one private directory, and the JSON cache of tuned kernels.

**The directory.** Every cache of tfx_vec lives under :func:`cache_root`: ``$TFX_VEC_CACHE_DIR``,
else ``$XDG_CACHE_HOME/tfx_vec``, else ``~/.cache/tfx_vec`` (compiled kernels in ``kernels/``,
the TF op libraries in ``ops/``, PTX in ``ptx/``, build scratch space in ``tmp/``).
:func:`private_dir` creates each directory with mode 0700 and refuses (``TcSecurityError``) one
that is a symbolic link, is owned by another user, or that others can write, and one below a
parent that another user owns or can write without the sticky bit (someone could swap it).  A
directory of ours readable by others is made 0700.  What is stored there and how it is trusted
is :mod:`tfx_vec.tc_ops.native`'s business.

**Tuned kernels** (paper §6.1), stored as JSON in a file the user names.
A key is (canonical TC with names templated, input shapes and dtypes, backend, device name,
tfx_vec version); each key keeps its best ``k`` entries (options + measured runtime + the
generated source), best first.  Never pickle, never a binary: only the options of an entry are
ever used (validated by ``MappingOptions``); its source is kept for the reader, never compiled.

Writes are atomic (tempfile in the same directory + ``os.replace``) and serialised between
processes with an advisory ``fcntl`` lock on ``<path>.lock`` (read-modify-write), so two processes
recording at once both keep their entries.  A corrupt or foreign file is reported with a
``CacheWarning`` and treated as empty; the next write replaces it.

Example::

    >>> import tempfile, os
    >>> c = CompilationCache(os.path.join(tempfile.mkdtemp(), "tc.json"), k=2)
    >>> key = c.key("def f(float(N) A) -> (B) { B(i) = A(i) }", "f", [((4,), "float32")], "cpu")
    >>> c.record(key, {"tile": [4]}, 1e-3)
    >>> c.best(key).options
    {'tile': [4]}
    >>> oct(os.stat(private_dir("kernels")).st_mode & 0o777)
    '0o700'
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import stat
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

from .errors import TcSecurityError

__all__ = ["cache_root", "private_dir", "check_private_file", "canonical_tc", "CacheKey",
           "CacheEntry", "CompilationCache", "CacheWarning"]

FORMAT = "tfx_vec.tc_ops.cache"
FORMAT_VERSION = 1


def cache_root() -> str:
    """The private directory of every tfx_vec cache (see the module docstring)."""
    return str(private_dir())


def _default_root() -> str:
    env = os.environ.get("TFX_VEC_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tfx_vec")


_LEGACY_WARNED = False


def _warn_legacy_setting() -> None:
    global _LEGACY_WARNED
    if os.environ.get("TFX_VEC_TC_CACHE_DIR") and not _LEGACY_WARNED:
        _LEGACY_WARNED = True
        warnings.warn("TFX_VEC_TC_CACHE_DIR is no longer read: compiled TC kernels go to "
                      "$TFX_VEC_CACHE_DIR/kernels with every other tfx_vec cache; unset it and "
                      "set TFX_VEC_CACHE_DIR to move the caches", CacheWarning, stacklevel=3)


def private_dir(*parts: str, root: str | os.PathLike | None = None) -> Path:
    """``<cache root>/<parts...>``, each level created with mode 0700 and checked private.

    Raises TcSecurityError (naming the directory and how to fix it) for a symbolic link, a
    directory another user owns or others can write, or an unsafe parent.
    """
    _warn_legacy_setting()
    top = Path(os.path.abspath(os.fspath(root) if root is not None else _default_root()))
    parent = Path(os.path.realpath(top.parent))
    _check_parents(parent, top)
    path = parent / top.name
    _ensure_private(path)
    for part in parts:
        if not part or part in (".", "..") or "/" in part or "\0" in part:
            raise TcSecurityError(f"tc_ops cache: bad directory name {part!r}")
        path = path / part
        _ensure_private(path)
    return path


def _check_parents(parent: Path, top: Path) -> None:
    """Every existing ancestor is ours or root's and not writable by others (unless sticky,
    as /tmp is); missing ones are created 0700."""
    missing = []
    p = parent
    while not p.exists():
        missing.append(p)
        p = p.parent
    for q in [p, *p.parents]:
        st = os.stat(q)
        if st.st_uid not in (0, os.getuid()):
            raise TcSecurityError(f"tc_ops cache: {top} lies below {q}, which user {st.st_uid} "
                                  "owns; set TFX_VEC_CACHE_DIR to a directory of your own")
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            raise TcSecurityError(f"tc_ops cache: {top} lies below {q}, which everyone can "
                                  "write (and it has no sticky bit); set TFX_VEC_CACHE_DIR to a "
                                  "directory of your own")
    for q in reversed(missing):
        _ensure_private(q)


def _ensure_private(path: Path) -> None:
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    fix = "remove it or set TFX_VEC_CACHE_DIR to another directory"
    if stat.S_ISLNK(st.st_mode):
        raise TcSecurityError(f"tc_ops cache: {path} is a symbolic link; cache directories are "
                              f"never followed through links ({fix})")
    if not stat.S_ISDIR(st.st_mode):
        raise TcSecurityError(f"tc_ops cache: {path} is not a directory ({fix})")
    if st.st_uid != os.getuid():
        raise TcSecurityError(f"tc_ops cache: {path} is owned by user {st.st_uid}, not by you "
                              f"({fix})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise TcSecurityError(f"tc_ops cache: {path} can be written by other users (mode "
                              f"{stat.S_IMODE(st.st_mode):o}); run chmod 700 {path} or {fix}")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)


def check_private_file(fd: int, path: str | os.PathLike) -> os.stat_result:
    """fstat of an open cache file: a regular file of ours that no one else can write."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or \
            st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise TcSecurityError(f"tc_ops cache: {path} is not a regular file of yours that only "
                              "you can write; remove it")
    return st


class CacheWarning(UserWarning):
    """A cache file was corrupt, foreign or unwritable; it is ignored."""


# Words that are part of the language, not user names: they stay as written.
_KEYWORDS = frozenset("""
def where in float double half int8 int16 int32 int64 uint8 uint16 uint32 uint64 bool float16
float32 float64 exp log tanh sqrt fmaxf fminf fmax fmin abs fabs max min sigmoid rsqrt pow
sin cos floor ceil erf expf logf tanhf sqrtf powf
""".split())
_TOKEN = re.compile(r"\s*(?:(#[^\n]*)|([A-Za-z_][A-Za-z_0-9]*)|(\d+\.?\d*(?:[eE][-+]?\d+)?f?)"
                    r"|(\S))")


def canonical_tc(source: str, entry: str | None = None) -> str:
    """``source`` with comments and layout dropped and user names templated.

    Names are replaced by ``_0, _1, ...`` in order of first appearance, so two TCs that differ
    only in names (or whitespace/comments) share cache entries (paper §6.1).

    >>> canonical_tc("def f(float(N) A) -> (B) { B(i) = A(i) # copy\\n}")
    'def _0 ( float ( _1 ) _2 ) - > ( _3 ) { _3 ( _4 ) = _2 ( _4 ) }'
    >>> canonical_tc("def g(float(M) X)->(Y){Y(j)=X(j)}") == canonical_tc(
    ...     "def f(float(N) A) -> (B) { B(i) = A(i) }")
    True
    """
    names: dict[str, str] = {}
    out = []
    for m in _TOKEN.finditer(source):
        comment, ident, number, other = m.groups()
        if comment:
            continue
        if ident:
            if ident in _KEYWORDS:
                out.append(ident)
            else:
                out.append(names.setdefault(ident, f"_{len(names)}"))
        elif number or other:
            out.append(number or other)
    if entry is not None:
        out.append(f"@entry={names.get(entry, entry)}")
    return " ".join(out)


@dataclasses.dataclass(frozen=True)
class CacheKey:
    """What a cached kernel depends on.  ``digest`` is its stable identity in the file."""

    tc: str
    inputs: tuple[tuple[tuple[int, ...], str], ...]
    backend: str
    device: str
    version: str

    def to_json(self) -> dict:
        """The key as JSON data (tuples become lists), as stored in the file."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @property
    def digest(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """One measured version: JSON options, seconds per call, optional generated source."""

    options: dict
    runtime: float
    source: str | None = None
    created: float = 0.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Any) -> "CacheEntry":
        if not (isinstance(d, dict) and isinstance(d.get("options"), dict)
                and isinstance(d.get("runtime"), (int, float))
                and (d.get("source") is None or isinstance(d.get("source"), str))):
            raise ValueError(f"malformed cache entry {str(d)[:80]!r}")
        return cls(d["options"], float(d["runtime"]), d.get("source"),
                   float(d.get("created", 0.0)))


class CompilationCache:
    """A JSON file of best-``k`` kernel versions per :class:`CacheKey`.

    Example:
        >>> import numpy as np
        >>> cache = CompilationCache("tc_cache.json", k=2)
        >>> key = cache.key("def neg(float(N) A) -> (B) { B(i) = -A(i) }", "neg",
        ...                 [((8,), np.float32)], backend="cpu")
        >>> cache.record(key, {"unroll": 4}, runtime=2e-6)
        >>> cache.record(key, {"unroll": 2}, runtime=1e-6)
        >>> cache.best(key).options, len(cache.lookup(key))
        ({'unroll': 2}, 2)
    """

    def __init__(self, path: str | os.PathLike, k: int = 3):
        if k < 1:
            raise ValueError(f"CompilationCache: k must be >= 1, got {k}")
        self.path = os.fspath(path)
        self.k = k

    def key(self, source: str, entry: str, inputs: Sequence[tuple[Sequence[int], Any]],
            backend: str, device: str = "") -> CacheKey:
        """Build the key for ``entry`` of ``source`` called on ``inputs`` = [(shape, dtype)]."""
        from tfx_vec import __version__

        canon_inputs = tuple((tuple(int(d) for d in shape), _dtype_name(dtype))
                             for shape, dtype in inputs)
        return CacheKey(canonical_tc(source, entry), canon_inputs, backend, device, __version__)

    # -- reading ---------------------------------------------------------------------------
    def _load(self) -> dict:
        """The file's ``keys`` table; {} (with a warning) when missing, corrupt or foreign."""
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            warnings.warn(f"tc_ops cache {self.path}: unreadable or corrupt ({e}); ignoring it",
                          CacheWarning, stacklevel=3)
            return {}
        if not (isinstance(data, dict) and data.get("format") == FORMAT
                and data.get("version") == FORMAT_VERSION and isinstance(data.get("keys"), dict)):
            warnings.warn(f"tc_ops cache {self.path}: not a tfx_vec.tc_ops cache of version "
                          f"{FORMAT_VERSION}; ignoring it", CacheWarning, stacklevel=3)
            return {}
        return data["keys"]

    def lookup(self, key: CacheKey) -> list[CacheEntry]:
        """Entries for ``key``, fastest first ([] on a miss)."""
        slot = self._load().get(key.digest)
        if not isinstance(slot, dict) or slot.get("key") != key.to_json():
            return []  # a digest collision or a tampered slot is a miss
        out = []
        for e in slot.get("entries", []):
            try:
                out.append(CacheEntry.from_json(e))
            except ValueError as err:
                warnings.warn(f"tc_ops cache {self.path}: {err}; skipped", CacheWarning)
        return sorted(out, key=lambda e: e.runtime)

    def best(self, key: CacheKey) -> CacheEntry | None:
        """The fastest entry for ``key`` or None."""
        entries = self.lookup(key)
        return entries[0] if entries else None

    # -- writing ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def record(self, key: CacheKey, options: dict, runtime: float,
               source: str | None = None) -> None:
        """Add a measured version; keep the best ``k`` for the key (one per distinct options)."""
        entry = CacheEntry(dict(options), float(runtime), source, time.time())
        json.dumps(entry.to_json())  # fail here, not halfway through a write, on bad options
        with self._locked():
            keys = self._load()
            slot = keys.get(key.digest)
            if not isinstance(slot, dict) or slot.get("key") != key.to_json():
                slot = {"key": key.to_json(), "entries": []}
            entries = [e for e in slot.get("entries", []) if isinstance(e, dict)
                       and e.get("options") != entry.options]
            entries.append(entry.to_json())
            entries.sort(key=lambda e: e.get("runtime", float("inf")))
            slot["entries"] = entries[: self.k]
            keys[key.digest] = slot
            self._write({"format": FORMAT, "version": FORMAT_VERSION, "keys": keys})

    def _write(self, data: dict) -> None:
        d = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(prefix=".tc_cache.", suffix=".json", dir=d)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def _dtype_name(dtype: Any) -> str:
    name = getattr(dtype, "name", None)
    if isinstance(name, str):
        return name
    import numpy as np

    return np.dtype(dtype).name
