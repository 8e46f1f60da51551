"""Native code for tc_ops: the tools that build it, the cache that keeps it, how it is loaded.

Three rules (see SECURITY.md and docs/tc_ops_security.md):

1. **Tools come from local configuration only**: ``$CC`` (default ``cc``), ``$CXX`` (default
   ``g++``), ``$NVCC`` (default ``nvcc`` on PATH or in /usr/local/cuda/bin), or
   :func:`configure` in Python.  They run without a shell, as an argv vector, on files this
   module wrote with ``mkstemp`` in a private scratch directory.  Nothing a graph, a model or a
   cache file holds ever becomes part of a command line.
2. **Everything built goes into a signed store** under :func:`~tfx_vec.tc_ops.cache.private_dir`:
   next to each product, a manifest naming what it was built from and the SHA-256 of its bytes,
   signed with HMAC-SHA256 under a per-user key kept outside the cache (``$TFX_VEC_KEY_FILE``,
   default ``~/.config/tfx_vec/cache_key``, mode 0600).  A product is used only when its
   manifest verifies, says it was built here from exactly these inputs, and its bytes hash to
   what it says; anything else is rebuilt (with a ``CacheWarning``).  A cache directory copied
   from another account or machine is therefore inert.
3. **Shared objects are loaded from the verified bytes**: copied to a fresh file of ours in the
   private scratch directory and dlopen'ed from there, so what runs is what was checked.

Example:
    >>> from tfx_vec.tc_ops import native
    >>> art = native.compile_source("kernels", "doc_add", "int add(int a, int b) { return a + b; }",
    ...                             ["-shared", "-fPIC"])
    >>> native.load_shared(art).add(2, 3)
    5
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import hmac
import json
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .cache import CacheWarning, check_private_file, private_dir
from .errors import TcBackendError, TcCompileError, TcSecurityError

__all__ = ["configure", "tool", "tool_identity", "run_tool", "user_key", "Artifact",
           "build_artifact", "compile_source", "load_shared", "loadable_copy", "COMPILE_TIMEOUT_S"]

#: A build that takes longer than this is stopped and reported (a TC compiles in seconds).
COMPILE_TIMEOUT_S = 600
_FORMAT = "tfx_vec.tc_ops.native/1"

# -- tools --------------------------------------------------------------------------------------
# setting -> (what it is, default command(s) tried in order)
_TOOLS = {
    "CC": ("C compiler", ("cc", "gcc")),
    "CXX": ("C++ compiler", ("g++", "c++")),
    "NVCC": ("CUDA compiler", ("nvcc", "/usr/local/cuda/bin/nvcc")),
}
_configured: dict[str, str] = {}


def configure(**settings: str | None) -> None:
    """Set tools from Python (``configure(CC="clang")``); ``None`` goes back to the environment.

    Settings made here win over the environment.  Only ``CC``, ``CXX`` and ``NVCC`` exist.

    Example:
        >>> from tfx_vec.tc_ops import native
        >>> native.configure(CC="gcc")
        >>> native.tool("CC")[0].endswith("gcc")
        True
        >>> native.configure(CC=None)          # back to $CC, or cc
    """
    for name, value in settings.items():
        if name not in _TOOLS:
            raise ValueError(f"tc_ops.native.configure: unknown setting {name!r} "
                             f"(settings: {', '.join(_TOOLS)})")
        if value is None:
            _configured.pop(name, None)
        else:
            _configured[name] = value


def tool(setting: str, required: bool = True) -> tuple[str, ...] | None:
    """The argv prefix of a tool (``$CC`` may hold flags: ``CC="ccache gcc"``), resolved on PATH.

    Raises TcBackendError naming the setting when it names no program (or, with ``required``,
    when no default exists); returns None for a missing default when not ``required``.

    Example:
        >>> import os
        >>> from tfx_vec.tc_ops import native
        >>> os.path.isabs(native.tool("CC")[0])
        True
    """
    what, defaults = _TOOLS[setting]
    value = _configured.get(setting) or os.environ.get(setting)
    if value:
        argv = shlex.split(value)
        exe = shutil.which(argv[0]) if argv else None
        if exe is None:
            where = "tc_ops.native.configure()" if setting in _configured else f"${setting}"
            raise TcBackendError(
                f"tc_ops: the {what} {value!r} (from {where}) was not found or is not "
                f"executable; set {setting} to a {what} on PATH (for example "
                f"{setting}={defaults[0]}) or unset it to use {defaults[0]}")
        return (exe, *argv[1:])
    for name in defaults:
        exe = shutil.which(name)
        if exe is not None:
            return (exe,)
    if required:
        raise TcBackendError(f"tc_ops: no {what} found (tried {', '.join(defaults)}); install "
                             f"one or set {setting} to it")
    return None


def run_tool(setting: str, args: Sequence[str], what: str) -> subprocess.CompletedProcess:
    """Run ``tool(setting) + args`` without a shell; its output is captured.

    Raises TcCompileError when it fails or outlasts COMPILE_TIMEOUT_S (the message holds its
    output and the command), TcBackendError when the tool cannot be started.

    Example:
        >>> from tfx_vec.tc_ops import native
        >>> native.run_tool("CC", ["--version"], "asking the C compiler its version").returncode
        0
    """
    argv = [*tool(setting), *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=COMPILE_TIMEOUT_S, shell=False)
    except subprocess.TimeoutExpired as e:
        raise TcCompileError(f"{what}: {argv[0]} ran over {COMPILE_TIMEOUT_S} s and was "
                             "stopped") from e
    except OSError as e:
        raise TcBackendError(f"{what}: cannot run {argv[0]} ({e}); check ${setting}") from e
    if proc.returncode != 0:
        raise TcCompileError(f"{what} failed ({shlex.join(argv)}):\n{proc.stderr}{proc.stdout}")
    return proc


@functools.lru_cache(maxsize=None)
def _tool_identity(argv: tuple[str, ...]) -> str:
    """What a product built by ``argv`` depends on: the program and its version banner."""
    try:
        banner = subprocess.run([argv[0], "--version"], capture_output=True, text=True,
                                stdin=subprocess.DEVNULL, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        banner = ""
    return "\0".join([os.path.realpath(argv[0]), *argv[1:], banner])


@functools.lru_cache(maxsize=1)
def _host() -> str:
    """This machine's architecture and CPU features: binaries built with -march=native run only
    where these match, so they are part of every key."""
    flags = ""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features", "model name")):
                    flags += line
                if line.strip() == "":
                    break
    return f"{platform.machine()}\0{platform.system()}\0{flags}"


# -- the per-user key ---------------------------------------------------------------------------
_key_lock = threading.Lock()
_keys: dict[str, bytes] = {}


def _key_path() -> Path:
    env = os.environ.get("TFX_VEC_KEY_FILE")
    if env:
        return Path(os.path.abspath(env))
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "tfx_vec" / "cache_key"


def user_key() -> bytes:
    """The key that signs this user's cache manifests (created on first use, mode 0600).

    It lives outside the cache (``$TFX_VEC_KEY_FILE`` or ``~/.config/tfx_vec/cache_key``), so a
    cache directory alone can never vouch for itself.  Raises TcSecurityError when the file is a
    link, not ours, or readable by others.

    Example:
        >>> from tfx_vec.tc_ops import native
        >>> len(native.user_key()) >= 32
        True
    """
    path = _key_path()
    with _key_lock:
        key = _keys.get(str(path))
        if key is None:
            key = _keys[str(path)] = _read_or_create_key(path)
        return key


def _read_or_create_key(path: Path) -> bytes:
    folder = private_dir(root=path.parent)
    path = folder / path.name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        fd_tmp, tmp = tempfile.mkstemp(dir=folder, prefix=".key.")
        with os.fdopen(fd_tmp, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        try:
            os.link(tmp, path)          # atomic; the first of two racing processes wins
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise TcSecurityError(f"tc_ops: cannot open the cache key {path} ({e}); it must be a "
                              "regular file of yours (not a link); remove it to make a new one"
                              ) from e
    with os.fdopen(fd) as f:
        st = check_private_file(f.fileno(), path)
        if st.st_mode & 0o077:
            raise TcSecurityError(f"tc_ops: the cache key {path} is readable by others (mode "
                                  f"{st.st_mode & 0o777:o}); run chmod 600 {path}")
        text = f.read().strip()
    if len(text) < 32:
        raise TcSecurityError(f"tc_ops: the cache key {path} is too short; remove it to make a "
                              "new one")
    return text.encode()


# -- the signed store ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Artifact:
    """A verified build product: where it is cached, its bytes and their SHA-256.

    Example:
        >>> from tfx_vec.tc_ops import native
        >>> art = native.compile_source("kernels", "doc_one", "int one(void) { return 1; }",
        ...                             ["-shared", "-fPIC"])
        >>> art.path.name.startswith("doc_one-"), len(art.sha256)
        (True, 64)
    """

    path: Path
    data: bytes
    sha256: str


#: ``produce(workdir, out)`` writes the product to ``out``; files it needs go in ``workdir`` (a
#: fresh private directory, removed after).  It may return a log, kept as ``<product>.log``.
Produce = Callable[[Path, Path], "str | None"]

_store_lock = threading.Lock()


def build_artifact(kind: str, name: str, inputs: Mapping[str, str], produce: Produce,
                   suffix: str, *, identity: str = "") -> Artifact:
    """The product of ``produce`` on ``inputs``, from the signed store or built now.

    Args:
      kind: the store's sub-directory ("kernels", "ops", "ptx").
      name: a readable prefix of the file name (letters, digits, ``_``, ``-``).
      inputs: everything the product depends on, as text (source, flags, ...).
      produce: builds the product (see :data:`Produce`).
      identity: the tools' identity (``tool_identity``), part of the key.

    Example:
        >>> from tfx_vec.tc_ops import native
        >>> def produce(work, out):
        ...     out.write_bytes(b"built")
        >>> art = native.build_artifact("kernels", "doc_text", {"what": "a text"}, produce, ".txt")
        >>> art.data
        b'built'
        >>> native.build_artifact("kernels", "doc_text", {"what": "a text"}, None, ".txt").data
        b'built'
    """
    if not name or not all(c.isalnum() or c in "_-" for c in name):
        raise TcSecurityError(f"tc_ops cache: bad artifact name {name!r}")
    digest = hashlib.sha256()
    for k in sorted(inputs):
        digest.update(f"{len(k)}:{k}{len(inputs[k])}:".encode() + inputs[k].encode())
    key = hashlib.sha256(f"{_FORMAT}\0{digest.hexdigest()}\0{identity}\0{_host()}".encode()
                         ).hexdigest()
    folder = private_dir(kind)
    path = folder / f"{name}-{key[:32]}{suffix}"
    with _store_lock:
        hit = _verified(path, key)
        if hit is not None:
            return hit
        with tempfile.TemporaryDirectory(dir=private_dir("tmp"), prefix="build.") as work:
            out = Path(work) / f"product{suffix}"
            log = produce(Path(work), out)
            data = out.read_bytes()
        art = Artifact(path, data, hashlib.sha256(data).hexdigest())
        if log is not None:
            _write_private(path.with_name(path.name + ".log"), log.encode())
        _write_private(path, data)
        _write_private(_manifest_path(path), _sign({"format": _FORMAT, "key": key,
                                                    "sha256": art.sha256, "size": len(data)}))
        return art


def tool_identity(setting: str) -> str:
    """The identity of tool ``setting`` (path, arguments, version banner) for cache keys.

    Example:
        >>> from tfx_vec.tc_ops import native
        >>> native.tool_identity("CC") == native.tool_identity("CC")
        True
    """
    return _tool_identity(tool(setting))


def _manifest_path(path: Path) -> Path:
    return path.with_name(path.name + ".manifest")


def _sign(fields: dict) -> bytes:
    body = json.dumps(fields, sort_keys=True)
    tag = hmac.new(user_key(), body.encode(), hashlib.sha256).hexdigest()
    return json.dumps({"body": body, "hmac": tag}).encode()


def _read_private(path: Path) -> bytes | None:
    """A cache file's bytes (never through a link; None when missing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:     # ELOOP: a symbolic link
        raise TcSecurityError(f"tc_ops cache: cannot open {path} ({e}); cache entries are "
                              "never read through links; remove it") from e
    with os.fdopen(fd, "rb") as f:
        check_private_file(f.fileno(), path)
        return f.read()


def _write_private(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".new.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _verified(path: Path, key: str) -> Artifact | None:
    """The cached product at ``path`` if its manifest is ours, for ``key``, and matches its
    bytes; None (after a CacheWarning when something was there but failed) otherwise."""
    manifest = _read_private(_manifest_path(path))
    data = _read_private(path)
    if manifest is None and data is None:
        return None
    why = _check_manifest(manifest, data, key)
    if why is None:
        return Artifact(path, data, hashlib.sha256(data).hexdigest())
    warnings.warn(f"tc_ops cache: {path.name}: {why}; rebuilding it", CacheWarning, stacklevel=4)
    return None


def _check_manifest(manifest: bytes | None, data: bytes | None, key: str) -> str | None:
    if manifest is None or data is None:
        return "the product or its manifest is missing"
    try:
        outer = json.loads(manifest)
        body, tag = outer["body"], outer["hmac"]
        fields = json.loads(body)
    except (ValueError, KeyError, TypeError):
        return "the manifest is not one of ours"
    expected = hmac.new(user_key(), body.encode(), hashlib.sha256).hexdigest()
    if not isinstance(tag, str) or not hmac.compare_digest(tag, expected):
        return "the manifest's signature is not this user's (built elsewhere, or altered)"
    if not isinstance(fields, dict) or fields.get("format") != _FORMAT or \
            fields.get("key") != key:
        return "the manifest describes another build"
    if fields.get("sha256") != hashlib.sha256(data).hexdigest():
        return "the product's bytes are not the ones that were built"
    return None


# -- compiling ---------------------------------------------------------------------------------
def compile_source(kind: str, name: str, source: str, flags: Sequence[str], *,
                   setting: str = "CC", libs: Sequence[str] = ("-lm",),
                   source_suffix: str = ".c", suffix: str = ".so",
                   what: str = "compiling a generated TC kernel",
                   depends: Mapping[str, str] | None = None, keep_log: bool = False) -> Artifact:
    """``source`` compiled by tool ``setting`` with ``flags`` (``<tool> <flags> <file> -o <out>
    <libs>``), from the signed store or built now; the source goes to a ``mkstemp`` file in
    the private scratch directory.  ``depends``: more texts the product depends on (headers);
    ``keep_log``: keep the compiler's messages as ``<product>.log``.

    Example:
        >>> from tfx_vec.tc_ops import native
        >>> art = native.compile_source("kernels", "doc_twice", "int twice(int a) { return 2 * a; }",
        ...                             ["-shared", "-fPIC"])
        >>> native.load_shared(art).twice(21)
        42
    """
    def produce(work: Path, out: Path) -> str | None:
        fd, src = tempfile.mkstemp(dir=work, suffix=source_suffix)
        with os.fdopen(fd, "w") as f:
            f.write(source)
        proc = run_tool(setting, [*flags, src, "-o", str(out), *libs], what)
        return f"{proc.stderr}{proc.stdout}" if keep_log else None

    inputs = {**(depends or {}), "source": source, "flags": shlex.join(flags),
              "libs": shlex.join(libs)}
    return build_artifact(kind, name, inputs, produce, suffix, identity=tool_identity(setting))


# -- loading ----------------------------------------------------------------------------------
def load_shared(artifact: Artifact, mode: int = os.RTLD_NOW | os.RTLD_LOCAL) -> ctypes.CDLL:
    """dlopen exactly ``artifact.data``: written to a fresh private file, loaded, unlinked.

    Example:
        >>> from tfx_vec.tc_ops import native
        >>> art = native.compile_source("kernels", "doc_neg", "int neg(int a) { return -a; }",
        ...                             ["-shared", "-fPIC"])
        >>> native.load_shared(art).neg(7)
        -7
    """
    with loadable_copy(artifact) as path:
        return ctypes.CDLL(path, mode=mode)


@contextlib.contextmanager
def loadable_copy(artifact: Artifact):
    """A path holding exactly ``artifact.data`` while the block runs (a fresh private file,
    removed after; a mapping made from it stays valid).

    Example:
        >>> import os
        >>> from tfx_vec.tc_ops import native
        >>> art = native.compile_source("kernels", "doc_one", "int one(void) { return 1; }",
        ...                             ["-shared", "-fPIC"])
        >>> with native.loadable_copy(art) as path:
        ...     open(path, "rb").read() == art.data
        True
        >>> os.path.exists(path)
        False
    """
    fd, path = tempfile.mkstemp(dir=private_dir("tmp"), prefix="load.", suffix=".so")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(artifact.data)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
