"""Where sparsegnn keeps what outlives a process (no sparsegnn imports: every layer may use it)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$SPARSEGNN_CACHE``, else ``platformdirs.user_cache_dir("sparsegnn")`` when platformdirs
    is installed, else ``~/.cache/sparsegnn``: the root of the tuner's decisions (``tune/``),
    generated graphs and Triton's stored key (``triton_key/``)."""
    env = os.environ.get("SPARSEGNN_CACHE")
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs
    except ImportError:
        return Path.home() / ".cache" / "sparsegnn"
    return Path(platformdirs.user_cache_dir("sparsegnn"))
