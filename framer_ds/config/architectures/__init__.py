"""The architecture files (config.json, no weights) of every base model a shipped recipe names, so that
`framer-ds plan` sizes a job before its weights are downloaded (README.md here says where each came from).

A run config maps its local model directories to these repo ids (`architectures:`); a hub repo id named
directly is found here too. Only the planner reads them, and only for a directory that is not on disk:
training always reads the weights it was pointed at.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parent


def shipped_repo_ids() -> list[str]:
    """Every repo id with shipped architecture files: the folders two levels down (owner/name)."""
    return sorted(
        f"{owner.name}/{repo.name}"
        for owner in ROOT.iterdir()
        if owner.is_dir()
        for repo in owner.iterdir()
        if repo.is_dir()
    )


def shipped_architecture(repo_id: str) -> Path | None:
    """The folder holding `repo_id`'s config.json files (in the repo's own layout), or None."""
    if repo_id.count("/") != 1 or ".." in repo_id:
        return None
    folder = ROOT / repo_id
    return folder if folder.is_dir() else None
