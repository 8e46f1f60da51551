"""Compilation cache (placeholder root helper; full cache below)."""
import os


def cache_root() -> str:
    """Directory of tfx_vec's on-disk caches: ``$TFX_VEC_CACHE_DIR`` or ``~/.cache/tfx_vec``."""
    root = os.environ.get("TFX_VEC_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "tfx_vec")
    os.makedirs(root, exist_ok=True)
    return root
