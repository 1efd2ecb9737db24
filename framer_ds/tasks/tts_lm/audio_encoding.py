"""Text + audio files -> text + SNAC codes, once, into a cache that training reads as format 'codes'.

Why shards: encoding hours of speech takes a while and jobs get killed. Rows are encoded in shards of
`SHARD_ROWS`, each written atomically; a restarted run skips finished shards (resumable) and a half
written one never exists. A file that cannot be read becomes an error entry naming it, counted and
reported, never a crash in the middle of a corpus.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from framer_ds.storage.atomic import atomic_write_json, atomic_write_text
from framer_ds.tasks.tts_lm.snac_codec import AudioReadError, encode_batch, read_audio

SHARD_ROWS = 256
DONE = "encoded.json"


@dataclass
class EncodedSet:
    rows: list[dict[str, Any]]  # text, codes (and speaker), in manifest order, for the rows that encoded
    failures: list[str]  # "<file>: <why>" for each row that did not


def encoded_dir_for(manifest: Path, codec_dir: Path, root: Path) -> Path:
    """A cache directory keyed by the manifest's content and the codec's weights."""
    digest = hashlib.sha256()
    digest.update(Path(manifest).read_bytes())
    for name in ("config.json", "pytorch_model.bin"):
        stat = (Path(codec_dir) / name).stat()
        digest.update(f"{name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return root / digest.hexdigest()[:16]


def encode_rows(
    rows: Sequence[dict[str, Any]],
    audio_root: Path,
    out_dir: Path,
    codec,
    columns: dict[str, str | None],
    batch_size: int,
    show_progress: bool = True,
    on_shard: Callable[[int], None] | None = None,
) -> EncodedSet:
    """Encode every row's audio (resuming finished shards) and return the whole encoded set."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shards = range(0, len(rows), SHARD_ROWS)
    bar = tqdm(total=len(rows), desc="encode audio", unit="file", disable=not show_progress)
    for start in shards:
        path = out_dir / f"shard_{start // SHARD_ROWS:05d}.jsonl"
        chunk = rows[start : start + SHARD_ROWS]
        if not path.is_file():
            entries = _encode_chunk(chunk, start, audio_root, codec, columns, batch_size, bar)
            atomic_write_text(path, "".join(json.dumps(e) + "\n" for e in entries))
            if on_shard is not None:
                on_shard(start // SHARD_ROWS)
        else:
            bar.update(len(chunk))
    bar.close()
    encoded = read_encoded(out_dir, len(shards))
    atomic_write_json(
        out_dir / DONE, {"rows": len(rows), "encoded": len(encoded.rows), "failed": len(encoded.failures)}
    )
    return encoded


def is_encoded(out_dir: Path) -> bool:
    return (out_dir / DONE).is_file()


def read_encoded(out_dir: Path, shards: int | None = None) -> EncodedSet:
    paths = sorted(out_dir.glob("shard_*.jsonl"))
    if shards is not None:
        paths = paths[:shards]
    rows, failures = [], []
    for path in paths:
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if "error" in entry:
                failures.append(entry["error"])
            else:
                rows.append(entry)
    return EncodedSet(rows, failures)


def _encode_chunk(chunk, first_row, audio_root, codec, columns, batch_size, bar) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    loaded: list[tuple[int, dict[str, Any], Any]] = []

    def flush() -> None:
        if not loaded:
            return
        codes = encode_batch(codec, [wave for _, _, wave in loaded])
        for (row_index, row, _), utterance in zip(loaded, codes, strict=True):
            entry = {"row": row_index, "text": row.get(columns["text"]), "codes": utterance}
            if columns.get("speaker"):
                entry["speaker"] = row.get(columns["speaker"])
            entries.append(entry)
        bar.update(len(loaded))
        loaded.clear()

    for offset, row in enumerate(chunk):
        index = first_row + offset
        relative = row.get(columns["audio"])
        if not isinstance(relative, str):
            entries.append(
                {"row": index, "error": f"row {index}: no audio path in column {columns['audio']!r}"}
            )
            bar.update(1)
            continue
        path = Path(relative) if Path(relative).is_absolute() else audio_root / relative
        try:
            loaded.append((index, row, read_audio(path, codec.sampling_rate)))
        except AudioReadError as exc:
            entries.append({"row": index, "error": f"row {index}: {exc}"})
            bar.update(1)
        if len(loaded) == batch_size:
            flush()
    flush()
    entries.sort(key=lambda e: e["row"])
    return entries
