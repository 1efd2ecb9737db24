"""A checkpoint's manifest: every file with its size and sha256, written last; and its verification.

Why: a checkpoint cut short (disk full, a copy interrupted, a file truncated by hand) used to make
`resume: latest` die with a traceback deep in torch.load, or worse, load. With the manifest, `latest`
skips a checkpoint that does not verify and says why, an explicit `train.resume` names the bad file,
and a file that is not in the manifest is refused: checkpoints hold pickles, which run code when
loaded, so nothing the run did not write itself is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from framer_ds.storage.atomic import atomic_write_json

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
# Problems with these cost exact reproducibility, not correctness: the run resumes with a warning.
OPTIONAL_FILES = re.compile(r"^random_states_\d+\.pkl$")
# Written into a checkpoint after its manifest (a universal conversion carries its own manifest).
EXCLUDED_DIRS = frozenset({"universal"})
_CHUNK = 8 * 2**20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)  # hashlib releases the GIL on large buffers: threads hash in parallel
    return digest.hexdigest()


def _listed_files(directory: Path) -> list[str]:
    found = []
    for root, dirs, files in os.walk(directory):
        if Path(root) == directory:
            dirs[:] = [d for d in dirs if d not in EXCLUDED_DIRS and not d.startswith(".")]
        for name in files:
            relative = (Path(root) / name).relative_to(directory).as_posix()
            if relative != MANIFEST_NAME:
                found.append(relative)
    return sorted(found)


def _hashes(directory: Path, names: list[str]) -> dict[str, str]:
    workers = max(1, min(8, os.cpu_count() or 1, len(names)))
    with ThreadPoolExecutor(workers) as pool:
        return dict(zip(names, pool.map(lambda n: sha256_file(directory / n), names), strict=True))


def write_manifest(directory: Path) -> None:
    """Record every file under `directory` (call when everything else is written; one process)."""
    directory = Path(directory)
    names = _listed_files(directory)
    hashes = _hashes(directory, names)
    files = {name: {"size": (directory / name).stat().st_size, "sha256": hashes[name]} for name in names}
    atomic_write_json(directory / MANIFEST_NAME, {"format": MANIFEST_FORMAT, "files": files})


@dataclass
class Verification:
    """`problems`: the checkpoint must not be loaded. `warnings`: it may, with reduced guarantees."""

    directory: Path
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_checkpoint(directory: Path) -> Verification:
    """Sizes first (cheap, catches truncation), then hashes of the files whose size matches."""
    directory = Path(directory)
    result = Verification(directory)
    manifest_path = directory / MANIFEST_NAME
    if not manifest_path.is_file():
        # The manifest is written last: without it nothing says the rest is whole (a deleted manifest
        # used to be read as "written before 0.2" and stopped `latest` from falling back).
        result.problems.append(
            f"{manifest_path} is missing, so the checkpoint is incomplete (the manifest is written last) "
            "and cannot be verified"
        )
        return result
    try:
        files: dict[str, dict] = json.loads(manifest_path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        result.problems.append(f"{manifest_path} is unreadable ({exc})")
        return result

    def report(name: str, message: str) -> None:
        if OPTIONAL_FILES.match(Path(name).name):
            rank = re.findall(r"\d+", Path(name).name)[0]
            result.warnings.append(
                f"{directory / name} {message}: rank {rank} resumes with a fresh random state, so the "
                "run is no longer exactly reproducible"
            )
        else:
            result.problems.append(f"{directory / name} {message}")

    present = set(_listed_files(directory))
    for name in sorted(present - set(files)):
        result.problems.append(
            f"{directory / name} is not in the manifest: a checkpoint is trusted input (it holds pickles), "
            "so files the run did not write are refused; remove it"
        )
    to_hash = []
    for name, entry in sorted(files.items()):
        path = directory / name
        if name not in present:
            report(name, "is missing")
        elif path.stat().st_size != entry.get("size"):
            report(
                name, f"has {path.stat().st_size} bytes, the manifest says {entry.get('size')} (truncated?)"
            )
        else:
            to_hash.append(name)
    for name, digest in _hashes(directory, to_hash).items():
        if digest != files[name].get("sha256"):
            report(name, "does not match its sha256 in the manifest (corrupted)")
    return result
