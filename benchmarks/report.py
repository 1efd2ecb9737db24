"""docs/benchmarks.md: each benchmark script owns one `## name` section and rewrites only that."""

from __future__ import annotations

import re
from pathlib import Path

from framer_ds.storage.atomic import atomic_write_text

DOC_HEADER = "# Benchmarks\n\nEach section is written by the script named in it.\n"


def write_section(path: Path, heading: str, section: str) -> None:
    """Replace (or append) the section starting with `heading` (e.g. '## step_overhead'); other sections
    stay as they are. Written atomically, so an interrupted run never truncates the file."""
    text = path.read_text() if path.exists() else DOC_HEADER
    found = re.search(rf"^{re.escape(heading)}$", text, flags=re.M)
    if found is None:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        after = re.search(r"^## ", text[found.end() :], flags=re.M)
        rest = text[found.end() + after.start() :] if after else ""
        text = text[: found.start()] + section + ("\n" + rest if rest else "")
    atomic_write_text(path, text)
