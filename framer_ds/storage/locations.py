"""Default locations on disk, shared by every task and tool."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV_VAR = "FRAMER_DS_CACHE"


def default_cache_dir() -> Path:
    """`$FRAMER_DS_CACHE` when set (shared or scratch disks on clusters), else `~/.cache/framer_ds`.

    Built-in datasets, tiny models, video indexes and latent caches live under it, so one variable
    moves all of them off a small home directory."""
    env = os.environ.get(CACHE_ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "framer_ds"
