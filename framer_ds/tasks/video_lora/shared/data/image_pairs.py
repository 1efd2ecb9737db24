"""Image-pair data for video_lora's interpolation layout: `{id}_start.ext` + `{id}_end.ext` files under
a root, the first and last frame of each clip to learn.

Why its own module: pairs are images, not videos; nothing about them is probed, cached or numbered in
frames as the video index (video_index.py) does. A half without its partner, or one id in two
formats, is reported with every other such problem at once.
"""

from __future__ import annotations

from pathlib import Path

from framer_ds.config.errors import ConfigError, ConfigProblem

PAIR_EXTENSIONS: frozenset[str] = frozenset({".png", ".jpg", ".jpeg", ".webp"})


def scan_image_pairs(root: Path) -> list[tuple[str, Path, Path]]:
    """(id, start, end) for every `{id}_start.ext` + `{id}_end.ext` under `root` (recursive; the id
    keeps its sub-directory). A half without its partner, or one id in two formats, is a problem."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise ConfigError([ConfigProblem("data.source.path", f"{root} is not a directory.")], str(root))
    halves: dict[str, dict[str, list[Path]]] = {}
    for path in sorted(p for p in root.rglob("*") if p.suffix.lower() in PAIR_EXTENSIONS):
        for role in ("start", "end"):
            if path.stem.endswith(f"_{role}") and not path.name.startswith("."):
                pid = (path.parent / path.stem[: -len(role) - 1]).relative_to(root).as_posix()
                halves.setdefault(pid, {"start": [], "end": []})[role].append(path)
    pairs, problems = [], []
    for pid, found in sorted(halves.items()):
        for role, other in (("start", "end"), ("end", "start")):
            if len(found[role]) > 1:
                names = ", ".join(p.name for p in found[role])
                problems.append(ConfigProblem(pid, f"several {role} images ({names}); keep one."))
            if found[role] and not found[other]:
                problems.append(
                    ConfigProblem(
                        str(found[role][0]),
                        f"no matching {pid}_{other}.(png|jpg|jpeg|webp); add it or remove this file.",
                    )
                )
        if len(found["start"]) == 1 and len(found["end"]) == 1:
            pairs.append((pid, found["start"][0], found["end"][0]))
    if not halves:
        problems.append(ConfigProblem(str(root), "no {id}_start.png / {id}_end.png image pairs found."))
    if problems:
        raise ConfigError(problems, source=str(root))
    return pairs
