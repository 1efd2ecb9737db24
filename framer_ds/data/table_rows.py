"""Rows of a data set from the three forms speech corpora come in: JSON lines, Parquet, or a
`datasets.save_to_disk` directory. One reader so every task and tool sees the same rows, and a bad file
is named with the line or the fix instead of a pyarrow traceback."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from framer_ds.compat import require


class TableReadError(ValueError):
    """A data file that cannot be read; the message names the file, the line and the fix."""


def table_format(path: Path) -> str:
    path = Path(path)
    if path.is_dir():
        if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
            return "save_to_disk"
        raise TableReadError(
            f"{path} is a directory but not a datasets.save_to_disk one (no dataset_info.json); point at "
            "a .jsonl or .parquet file, or at the directory `Dataset.save_to_disk` wrote"
        )
    if not path.is_file():
        raise TableReadError(f"{path} does not exist")
    if path.suffix in {".jsonl", ".json"} or path.name.endswith((".jsonl.gz", ".json.gz")):
        return "jsonl"
    if path.suffix == ".parquet":
        return "parquet"
    raise TableReadError(
        f"{path}: unknown file type {path.suffix!r}; use .jsonl(.gz), .parquet or a save_to_disk dir"
    )


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Every row as a dict (lists stay lists)."""
    return list(iter_rows(path))


def iter_rows(path: Path) -> Iterator[dict[str, Any]]:
    path = Path(path)
    kind = table_format(path)
    if kind == "jsonl":
        yield from _json_lines(path)
        return
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as exc:  # pyarrow raises several types for damaged files
            raise TableReadError(f"{path}: not a readable Parquet file ({exc}); re-export it") from None
        yield from table.to_pylist()
        return
    datasets = require("datasets", "reading a save_to_disk directory")
    try:
        dataset = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise TableReadError(f"{path}: datasets.load_from_disk failed ({exc})") from None
    if isinstance(dataset, datasets.DatasetDict):
        if "train" not in dataset:
            raise TableReadError(
                f"{path} holds splits {list(dataset)}; point at one split's directory (e.g. {path}/train)"
            )
        dataset = dataset["train"]
    yield from dataset


def _json_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The rows of a .jsonl file, or of a gzipped one (.jsonl.gz: token and code files compress ~3x)."""
    with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as lines:
        number = 0
        try:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TableReadError(
                        f"{path}:{number}: not valid JSON ({exc.msg}); "
                        "a truncated write? fix or delete the line"
                    ) from None
                if not isinstance(row, dict):
                    raise TableReadError(f"{path}:{number}: a JSON object per line is expected")
                yield row
        except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError; a cut-off file is EOFError
            raise TableReadError(
                f"{path}: not a readable gzip file after line {number} ({exc or 'truncated'}); re-compress it"
            ) from None


def columns_problems(rows: list[dict[str, Any]], needed: list[str], path: Path, key: str) -> list[str]:
    """Which of `needed` the first row lacks, phrased for the config key that names them."""
    if not rows:
        return [f"{path} holds no rows"]
    missing = [name for name in needed if name not in rows[0]]
    if missing:
        return [f"{path} has no column(s) {missing} (it has {sorted(rows[0])}); set {key} to the right names"]
    return []
