"""What `framer-ds plan` builds when a config's model directories are not on disk yet: the architecture
framer_ds ships for the published model (framer_ds/config/architectures), on the meta device.

Why: planning is what a user does before a 10 GB download. A directory the config maps to a repo id
(`architectures:`), or a hub repo id named directly, that is absent here is replaced - for this plan only,
as a dotted override - by the shipped folder, which holds the repo's config.json files in its own layout
and no weights: the same "local directory without weights" the census already builds from.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from framer_ds.config.architectures import shipped_architecture
from framer_ds.config.schema import RunConfigBase


def _leaves(value: Any, key: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for name, item in value.items():
            yield from _leaves(item, f"{key}.{name}" if key else str(name))
    else:
        yield key, value


def stand_in_overrides(config: RunConfigBase) -> tuple[list[str], list[str]]:
    """(overrides pointing absent model directories at their shipped architecture, one line per base
    saying so). Nothing when every directory the config names is on disk."""
    overrides, notes = [], []
    dumped = config.model_dump(exclude={"architectures"})
    for key, value in _leaves(dumped, ""):
        if not isinstance(value, (str, Path)) or Path(value).exists():
            continue
        text = str(value)
        repo = config.architectures.get(text, text)
        folder = shipped_architecture(repo)
        if folder is None:
            continue
        overrides.append(f"{key}={folder}")
        notes.append(
            f"{key}: {text} is not on disk; built on the meta device from the config.json of {repo} "
            "shipped with framer_ds (no weights read)"
        )
    return overrides, notes
