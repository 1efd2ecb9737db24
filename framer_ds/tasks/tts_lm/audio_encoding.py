"""Text + audio files -> text + SNAC codes, once, into a cache that training reads as format 'codes'.

Why shards rewritten per batch: encoding hours of speech takes a while and jobs get killed. Clips are
encoded in shards of `SHARD_ROWS`; after every codec batch the shard's file is rewritten atomically
(storage/atomic.py) with every entry so far, so a killed encode keeps each finished batch and a restart
encodes only the clips after it; a half written file never exists. A clip that cannot be read becomes
an error entry naming it and why, counted and reported, never a crash in the middle of a corpus.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from framer_ds.storage.atomic import atomic_write_json, atomic_write_text
from framer_ds.tasks.tts_lm.audio_layouts import AudioItem, items_digest
from framer_ds.tasks.tts_lm.snac_codec import AudioReadError, encode_batch, read_audio

SHARD_ROWS = 256
DONE = "encoded.json"


@dataclass
class EncodedSet:
    rows: list[dict[str, Any]]  # text, codes (and speaker), in item order, for the clips that encoded
    failures: list[str]  # "<file>: <why>" for each clip that did not
    fresh: int = 0  # clips encoded by this call (the rest were in the cache already)


def encoded_dir_for(layout: str, items: list[AudioItem], codec_dir: Path, root: Path) -> Path:
    """A cache directory keyed by the clips (texts, speakers, files) and the codec's weights."""
    digest = hashlib.sha256(items_digest(layout, items).encode())
    for name in ("config.json", "pytorch_model.bin"):
        stat = (Path(codec_dir) / name).stat()
        digest.update(f"{name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return root / digest.hexdigest()[:16]


def encode_items(
    items: Sequence[AudioItem], out_dir: Path, codec, batch_size: int, show_progress: bool = True
) -> EncodedSet:
    """Encode every clip not yet in `out_dir` and return the whole encoded set."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shards = range(0, len(items), SHARD_ROWS)
    bar = tqdm(total=len(items), desc="encode audio", unit="file", disable=not show_progress)
    fresh = 0
    for start in shards:
        path = out_dir / f"shard_{start // SHARD_ROWS:05d}.jsonl"
        chunk = items[start : start + SHARD_ROWS]
        entries = _read_entries(path)  # a prefix of the chunk, from an earlier (maybe killed) encode
        bar.update(len(entries))
        if len(entries) < len(chunk):
            before = sum("error" not in e for e in entries)
            _encode_chunk(chunk, start, entries, path, codec, batch_size, bar)
            fresh += sum("error" not in e for e in entries) - before
    bar.close()
    encoded = read_encoded(out_dir, len(shards))
    encoded.fresh = fresh
    atomic_write_json(
        out_dir / DONE, {"rows": len(items), "encoded": len(encoded.rows), "failed": len(encoded.failures)}
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
        for entry in _read_entries(path):
            if "error" in entry:
                failures.append(entry["error"])
            else:
                rows.append(entry)
    return EncodedSet(rows, failures)


def _read_entries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def _encode_chunk(
    chunk: Sequence[AudioItem],
    first_row: int,
    entries: list[dict[str, Any]],
    path: Path,
    codec,
    batch_size,
    bar,
) -> None:
    """Encode the clips of `chunk` after the `entries` already written, rewriting `path` after each
    batch; every clip before the current one is then either encoded or an error entry, so the file
    always holds a prefix of the chunk."""
    loaded: list[tuple[int, AudioItem, Any]] = []

    def flush() -> None:
        if loaded:
            codes = encode_batch(codec, [wave for _, _, wave in loaded])
            for (row, item, _), utterance in zip(loaded, codes, strict=True):
                entry = {"row": row, "text": item.text, "codes": utterance}
                entries.append(entry if item.speaker is None else {**entry, "speaker": item.speaker})
            bar.update(len(loaded))
            loaded.clear()
        atomic_write_text(path, "".join(json.dumps(e) + "\n" for e in entries))

    for offset in range(len(entries), len(chunk)):
        item, row = chunk[offset], first_row + offset
        try:
            if item.error is not None:
                raise AudioReadError(item.error)
            source = item.path if item.data is None else io.BytesIO(item.data)
            loaded.append((row, item, read_audio(source, codec.sampling_rate, item.name)))
        except AudioReadError as exc:
            if loaded:  # keep the entries in clip order: the batch before this clip goes first
                flush()
            entries.append({"row": row, "error": str(exc)})
            bar.update(1)
        if len(loaded) == batch_size:
            flush()
    flush()
