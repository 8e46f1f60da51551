"""The caches of tc_ops: private directories (0700, ours, never through a link), a signed store
whose products are used only when built here from what they claim (anything else is rebuilt,
never loaded), a per-user key outside the cache, the compiler from local configuration with a
clear error when it is wrong."""
import json
import os
import stat
import uuid

import numpy as np
import pytest

from tfx_vec import tc_ops as tc
from tfx_vec.tc_ops import cache, native
from tfx_vec.tc_ops.backends import cpu
from tfx_vec.tc_ops.cache import CacheWarning, private_dir
from tfx_vec.tc_ops.errors import TcBackendError, TcCompileError, TcSecurityError

# A shared object that, if it were ever loaded, would create the marker file at once.
CONSTRUCTOR = """#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE* f = fopen("%s", "w"); if (f) fclose(f);
}
void tc_axpy(void* const* args) {}
"""
AXPY = "def axpy(float(N) X, float(N) Y) -> (Z) { Z(i) = 2 * X(i) + Y(i) }"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh cache root and key for one test."""
    monkeypatch.setenv("TFX_VEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TFX_VEC_KEY_FILE", str(tmp_path / "config" / "key"))
    monkeypatch.setattr(native, "_keys", {})
    return tmp_path / "cache"


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _axpy(tag: str = ""):
    """A kernel never compiled before (the tag changes its source): (artifact, source)."""
    source = f"/* {tag or uuid.uuid4().hex} */\nvoid tc_axpy(void* const* a) {{\n" \
             "  const float* x = a[0]; float* z = a[2];\n  for (int i = 0; i < 4; ++i) " \
             "z[i] = 2 * x[i];\n}\n"
    return cpu.compile_shared(source, tag="tc_axpy"), source


def _run_axpy(artifact) -> np.ndarray:
    x, z = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    cpu.CpuKernel(artifact, "tc_axpy").run([x, x, z])
    return z


# -- directories ---------------------------------------------------------------------------
def test_cache_directories_are_made_private_and_tightened(cache_dir):
    kernels = private_dir("kernels")
    assert kernels == cache_dir / "kernels"
    assert _mode(cache_dir) == _mode(kernels) == 0o700
    os.chmod(kernels, 0o755)                     # as an older version left it: readable
    private_dir("kernels")
    assert _mode(kernels) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_a_cache_directory_others_can_write_is_refused(cache_dir, mode):
    kernels = private_dir("kernels")
    os.chmod(kernels, mode)
    with pytest.raises(TcSecurityError, match="can be written by other users.*chmod 700"):
        private_dir("kernels")
    os.chmod(cache_dir, mode)
    with pytest.raises(TcSecurityError, match="can be written by other users"):
        tc.define(AXPY).axpy(np.ones(3, np.float32), np.ones(3, np.float32))


def test_a_cache_directory_of_another_user_is_refused(cache_dir, monkeypatch):
    private_dir("kernels")
    monkeypatch.setattr(os, "getuid", lambda: 4242)     # everything now belongs to someone else
    with pytest.raises(TcSecurityError, match="owned by user|which user"):
        private_dir("kernels")


def test_cache_directories_are_never_reached_through_links(cache_dir, tmp_path, monkeypatch):
    private_dir()
    os.symlink(tmp_path, cache_dir / "kernels")
    with pytest.raises(TcSecurityError, match="is a symbolic link"):
        private_dir("kernels")
    monkeypatch.setenv("TFX_VEC_CACHE_DIR", str(tmp_path / "link"))
    os.symlink(cache_dir, tmp_path / "link")
    with pytest.raises(TcSecurityError, match="is a symbolic link"):
        private_dir()


def test_a_cache_below_a_directory_everyone_can_write_needs_its_sticky_bit(tmp_path,
                                                                           monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)                      # anyone could swap our directory there
    monkeypatch.setenv("TFX_VEC_CACHE_DIR", str(shared / "cache"))
    with pytest.raises(TcSecurityError, match="everyone can write.*no sticky bit"):
        private_dir()
    os.chmod(shared, 0o1777)                     # as /tmp: others cannot rename our entries
    assert _mode(private_dir()) == 0o700


def test_the_legacy_kernel_directory_setting_is_reported_not_silently_ignored(cache_dir,
                                                                             monkeypatch):
    monkeypatch.setenv("TFX_VEC_TC_CACHE_DIR", str(cache_dir / "elsewhere"))
    monkeypatch.setattr(cache, "_LEGACY_WARNED", False)
    with pytest.warns(CacheWarning, match="TFX_VEC_TC_CACHE_DIR is no longer read"):
        private_dir("kernels")
    assert not (cache_dir / "elsewhere").exists()


# -- the key -------------------------------------------------------------------------------
def test_the_key_is_made_once_private_and_checked(cache_dir, tmp_path, monkeypatch):
    key = native.user_key()
    path = tmp_path / "config" / "key"
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    monkeypatch.setattr(native, "_keys", {})
    assert native.user_key() == key               # read back, not made again
    os.chmod(path, 0o644)
    monkeypatch.setattr(native, "_keys", {})
    with pytest.raises(TcSecurityError, match="readable by others.*chmod 600"):
        native.user_key()
    os.chmod(path, 0o600)
    os.rename(path, tmp_path / "real_key")
    os.symlink(tmp_path / "real_key", path)
    monkeypatch.setattr(native, "_keys", {})
    with pytest.raises(TcSecurityError, match="not a link"):
        native.user_key()


# -- the signed store ------------------------------------------------------------------------
def test_a_kernel_is_rebuilt_not_loaded_when_its_bytes_were_replaced(cache_dir, tmp_path):
    marker = tmp_path / "constructor_ran"
    art, source = _axpy()
    planted = cpu.compile_shared(CONSTRUCTOR % marker, tag="planted")   # never loaded
    art.path.write_bytes(planted.data)            # keeps the genuine manifest
    with pytest.warns(CacheWarning, match="bytes are not the ones that were built"):
        again = cpu.compile_shared(source, tag="tc_axpy")
    assert again.data != planted.data and again.path.read_bytes() == again.data
    np.testing.assert_array_equal(_run_axpy(again), 2 * np.arange(4))
    assert not marker.exists()


def test_a_manifest_signed_with_another_key_is_not_trusted(cache_dir, tmp_path, monkeypatch):
    """A cache made elsewhere (another user or machine: another key), even with manifests that
    match their products, is rebuilt before anything of it is loaded."""
    marker = tmp_path / "constructor_ran"
    art, source = _axpy()
    planted = cpu.compile_shared(CONSTRUCTOR % marker, tag="planted")
    monkeypatch.setenv("TFX_VEC_KEY_FILE", str(tmp_path / "other_key"))   # the forger's key
    monkeypatch.setattr(native, "_keys", {})
    forged = native._sign({"format": native._FORMAT, "key": _key_of(art),
                           "sha256": planted.sha256, "size": len(planted.data)})
    art.path.write_bytes(planted.data)
    _manifest(art).write_bytes(forged)
    monkeypatch.setenv("TFX_VEC_KEY_FILE", str(tmp_path / "config" / "key"))
    monkeypatch.setattr(native, "_keys", {})
    with pytest.warns(CacheWarning, match="signature is not this user's"):
        again = cpu.compile_shared(source, tag="tc_axpy")
    np.testing.assert_array_equal(_run_axpy(again), 2 * np.arange(4))
    assert again.data != planted.data and not marker.exists()


def _manifest(artifact):
    return artifact.path.with_name(artifact.path.name + ".manifest")


def _key_of(artifact) -> str:
    body = json.loads(_manifest(artifact).read_bytes())["body"]
    return json.loads(body)["key"]


def test_cache_entries_are_never_read_through_links_or_when_others_can_write(cache_dir,
                                                                           tmp_path):
    art, source = _axpy()
    os.chmod(art.path, 0o666)
    with pytest.raises(TcSecurityError, match="not a regular file of yours"):
        cpu.compile_shared(source, tag="tc_axpy")
    os.chmod(art.path, 0o600)
    os.rename(art.path, tmp_path / "elsewhere.so")
    os.symlink(tmp_path / "elsewhere.so", art.path)
    with pytest.raises(TcSecurityError, match="never read through links"):
        cpu.compile_shared(source, tag="tc_axpy")


def test_what_is_loaded_is_exactly_the_verified_bytes(cache_dir):
    """The loader copies the verified bytes to a fresh private file: changing the cached file
    after the check cannot change what runs."""
    art, _ = _axpy()
    art.path.write_bytes(b"garbage written after the check")
    np.testing.assert_array_equal(_run_axpy(art), 2 * np.arange(4))
    assert not list((cache_dir / "tmp").iterdir())      # the loaded copy is gone


# -- tools -----------------------------------------------------------------------------------
def test_a_missing_compiler_is_a_clear_error_naming_the_setting(cache_dir, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    src = AXPY.replace("2 *", f"{len(uuid.uuid4().hex)} *")      # never compiled before
    with pytest.raises(TcBackendError, match=r"C compiler '/nonexistent/cc' \(from \$CC\) was "
                                             r"not found.*set CC to a C compiler on PATH"):
        tc.define(src).axpy(np.ones(3, np.float32), np.ones(3, np.float32))
    monkeypatch.setenv("CC", "gcc -O1")          # a command with flags is split, not shelled
    out = tc.define(src).axpy(np.ones(3, np.float32), np.ones(3, np.float32))
    np.testing.assert_array_equal(out.numpy(), np.full(3, 33.0))
    native.configure(CC="/also/missing")
    try:
        with pytest.raises(TcBackendError, match=r"from tc_ops.native.configure\(\)"):
            native.tool("CC")
    finally:
        native.configure(CC=None)


def test_tools_run_without_a_shell(cache_dir, tmp_path, monkeypatch):
    marker = tmp_path / "shell_ran"
    monkeypatch.setenv("CC", f"gcc; touch {marker}")
    with pytest.raises(TcBackendError, match="was not found"):
        native.tool("CC")
    monkeypatch.setenv("CC", f"gcc -DX=$(touch {marker})")
    with pytest.raises(TcCompileError):
        cpu.compile_shared(f"/* {uuid.uuid4().hex} */ int f(void) {{ return 1; }}")
    assert not marker.exists()
