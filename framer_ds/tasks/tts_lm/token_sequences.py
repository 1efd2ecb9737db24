"""TTS training sequences: the token layout around text and audio, labels, and the length policy
(filter, truncate or pack) with the statistics the old scripts printed by hand.

One builder serves every way data comes in (pre-tokenized ids, SNAC codes, audio files encoded to
codes), so the layout cannot drift between them. Packing concatenates samples into fixed-length blocks
but keeps them apart: position ids restart per sample and `segment_ids` feed a block-diagonal causal
mask, so a packed batch gives the same logits as the samples one by one (tested).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

IGNORE_INDEX = -100
LengthPolicy = Literal["filter", "truncate", "pack", "split"]


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of the layout's markers. The VyvoTTS / Orpheus recipe appends them after the base
    vocabulary (`tokenizer_length`): see `relative_to`."""

    start_of_text: int | None  # the base tokenizer's BOS, or None when it has none
    end_of_text: int
    start_of_speech: int
    end_of_speech: int
    start_of_human: int
    end_of_human: int
    start_of_ai: int
    end_of_ai: int
    pad: int
    audio_start: int

    @classmethod
    def relative_to(cls, tokenizer_length: int, start_of_text: int | None, end_of_text: int) -> SpecialTokens:
        """The recipe's layout: markers at tokenizer_length + 1..7, audio codes from + 10."""
        n = tokenizer_length
        return cls(start_of_text, end_of_text, n + 1, n + 2, n + 3, n + 4, n + 5, n + 6, n + 7, n + 10)


@dataclass
class TokenSequence:
    input_ids: list[int]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


def build_sequence(
    text_ids: Sequence[int],
    audio_tokens: Sequence[int],
    special: SpecialTokens,
    loss_on: Literal["all", "audio"] = "all",
) -> TokenSequence:
    """[start_of_human] text [end_of_text] [end_of_human] [start_of_ai] [start_of_speech] audio
    [end_of_speech] [end_of_ai]. With loss_on=audio only the speech part is learned (the audio and the
    two end markers, so the model learns to stop); the prompt is context."""
    prompt = [special.start_of_human, *text_ids, special.end_of_text, special.end_of_human]
    prompt += [special.start_of_ai, special.start_of_speech]
    speech = [*audio_tokens, special.end_of_speech, special.end_of_ai]
    labels = (list(prompt) if loss_on == "all" else [IGNORE_INDEX] * len(prompt)) + speech
    return TokenSequence(prompt + speech, labels)


def generation_prompt(text_ids: Sequence[int], special: SpecialTokens) -> list[int]:
    """What a sample or `framer-ds sample` feeds the model: everything up to start_of_speech."""
    sequence = build_sequence(text_ids, [], special)
    return sequence.input_ids[:-2]


@dataclass
class LengthStats:
    """What the length policy did, for the log and the metrics."""

    samples: int
    min: int
    median: float
    p95: float
    max: int
    kept: int
    dropped: int = 0
    dropped_tokens: int = 0
    truncated: int = 0
    truncated_tokens: int = 0
    split: int = 0  # samples cut into pieces (length_policy split)
    split_pieces: int = 0  # the pieces they became
    padding_fraction: float = 0.0

    def as_metrics(self, prefix: str = "data/") -> dict[str, float]:
        return {f"{prefix}{k}": float(v) for k, v in vars(self).items()}

    def describe(self) -> str:
        text = (
            f"{self.samples} sequences: length min {self.min}, median {self.median:g}, p95 {self.p95:g}, "
            f"max {self.max}; kept {self.kept}"
        )
        if self.dropped:
            text += f", dropped {self.dropped} ({self.dropped_tokens} tokens)"
        if self.split:
            text += f", split {self.split} into {self.split_pieces} pieces"
        if self.truncated:
            text += f", truncated {self.truncated} ({self.truncated_tokens} tokens cut)"
        return text + f"; padding {self.padding_fraction:.1%} of the tokens in a batch"


class AllSamplesTooLong(ValueError):
    """Every sample exceeds max_seq_length: training would see nothing."""


@dataclass
class PackedBlock:
    """Samples laid end to end in one block of at most max_len tokens."""

    input_ids: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    segment_ids: list[int] = field(default_factory=list)  # 1, 2, ... per sample; 0 is padding

    def add(self, sequence: TokenSequence) -> None:
        segment = (self.segment_ids[-1] if self.segment_ids else 0) + 1
        self.input_ids += sequence.input_ids
        # The token before a sample's first one belongs to another sample: nothing may predict across.
        self.labels += [IGNORE_INDEX, *sequence.labels[1:]]
        self.position_ids += range(len(sequence))
        self.segment_ids += [segment] * len(sequence)

    def __len__(self) -> int:
        return len(self.input_ids)


def pack(sequences: Sequence[TokenSequence], max_len: int) -> list[PackedBlock]:
    """Best-fit decreasing: each sample, longest first, goes to the block with the least room that still
    fits it. Wastes a few percent at most on speech-like length distributions (benchmarks/tts_packing.py);
    the order is deterministic, so every rank builds the same blocks."""
    order = sorted(range(len(sequences)), key=lambda i: (-len(sequences[i]), i))
    blocks: list[PackedBlock] = []
    room: list[tuple[int, int]] = []  # (free tokens, block index), sorted
    for index in order:
        need = len(sequences[index])
        at = bisect.bisect_left(room, (need, -1))
        if at == len(room):
            blocks.append(PackedBlock())
            target, free = len(blocks) - 1, max_len
        else:
            free, target = room.pop(at)
        blocks[target].add(sequences[index])
        bisect.insort(room, (free - need, target))
    return blocks


def _padding_fraction(lengths: Sequence[int], batch_size: int, group_by_length: bool) -> float:
    """Share of pad tokens when batches are padded to their longest sample."""
    if not lengths:
        return 0.0
    ordered = sorted(lengths) if group_by_length else list(lengths)
    batches = [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
    padded = sum(max(b) * len(b) for b in batches)
    return 1.0 - sum(lengths) / padded


def apply_length_policy(
    sequences: Sequence[TokenSequence],
    max_len: int,
    policy: LengthPolicy,
    batch_size: int = 1,
    group_by_length: bool = True,
    splitter: Callable[[TokenSequence], list[TokenSequence] | None] | None = None,
) -> tuple[list[TokenSequence] | list[PackedBlock], LengthStats]:
    """The training items under `policy` and what it did. Packing drops samples longer than a block (a
    sample split across blocks would lose its prompt); `truncate` cuts them; `split` replaces each by the
    pieces `splitter` makes (splitting.py), dropping only what it cannot split. Raises
    AllSamplesTooLong, with the statistics, when nothing is left."""
    lengths = np.array([len(s) for s in sequences])
    if len(lengths) == 0:
        raise AllSamplesTooLong("no sequences: the data set is empty")
    stats = LengthStats(
        samples=len(lengths),
        min=int(lengths.min()),
        median=float(np.median(lengths)),
        p95=float(np.percentile(lengths, 95)),
        max=int(lengths.max()),
        kept=0,
    )
    too_long = lengths > max_len
    if policy == "truncate":
        items: list = [
            TokenSequence(s.input_ids[:max_len], s.labels[:max_len]) if long else s
            for s, long in zip(sequences, too_long, strict=True)
        ]
        stats.truncated = int(too_long.sum())
        stats.truncated_tokens = int((lengths[too_long] - max_len).sum())
    elif policy == "split" and splitter is not None:
        items = []
        for sequence, long in zip(sequences, too_long, strict=True):
            pieces = splitter(sequence) if long else [sequence]
            if pieces is None:  # not speech, or a prompt too long for any piece
                stats.dropped += 1
                stats.dropped_tokens += len(sequence)
                continue
            items += pieces
            stats.split += int(long)
            stats.split_pieces += len(pieces) if long else 0
    else:
        items = [s for s, long in zip(sequences, too_long, strict=True) if not long]
        stats.dropped = int(too_long.sum())
        stats.dropped_tokens = int(lengths[too_long].sum())
    if not items:
        raise AllSamplesTooLong(
            f"every sample is longer than max_seq_length={max_len} ({stats.describe()}); raise "
            "data.max_seq_length or use data.length_policy=truncate"
        )
    stats.kept = len(items)
    if policy == "pack":
        items = pack(items, max_len)
        stats.padding_fraction = 1.0 - sum(len(b) for b in items) / (len(items) * max_len)
    else:
        stats.padding_fraction = _padding_fraction([len(s) for s in items], batch_size, group_by_length)
    return items, stats


def length_grouped_order(lengths: Sequence[int], batch_size: int, seed: int, epoch: int) -> list[int]:
    """Sample order whose batches hold similar lengths (less padding) yet change every epoch: shuffle,
    sort within windows of 50 batches, shuffle the batches. Deterministic from (seed, epoch), so every
    rank derives the same order and a resumed run continues the same epoch."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    window = batch_size * 50
    ordered: list[int] = []
    for start in range(0, len(order), window):
        chunk = order[start : start + window]
        ordered += sorted(chunk.tolist(), key=lambda i: -lengths[i])
    batches = [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
    return [i for b in rng.permutation(len(batches)).tolist() for i in batches[b]]
