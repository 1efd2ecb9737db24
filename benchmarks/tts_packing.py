"""Useful tokens per second and padding for the TTS length policies on one speech-like length
distribution: pad-to-longest (random batches, the old script), truncate + pad to max length, and pack.

Why: speech sequences are long-tailed (a few long utterances among many short ones), so padding a batch
to its longest sample, or every sample to max_seq_length, spends most of the compute on pad tokens.
Packing (framer_ds/tasks/tts_lm/token_sequences.py) should waste < 5% and train >= 1.5x the useful tokens/s of
padding. Same tiny Llama (SDPA), same samples, same rows per batch, modes alternate so machine noise
hits all of them; a token is useful when it is a real (non-pad) token of a sample.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import random
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from report import write_section
from transformers import LlamaConfig, LlamaForCausalLM

from framer_ds.tasks.tts_lm.token_batches import collate_packed, collate_padded
from framer_ds.tasks.tts_lm.token_sequences import TokenSequence, apply_length_policy

SECTION = "## tts_packing"
AUDIO_TOKENS_PER_S = 82  # SNAC 24 kHz, 7 tokens per ~12 Hz frame


def speech_like_lengths(count: int, max_len: int, seed: int) -> list[int]:
    """Text prompt (10-60 tokens) + audio of a log-normal duration (median ~4 s, long tail), scaled so
    the longest few exceed max_len as in real data (the old scripts' 8192-token limit ~ 100 s)."""
    rng = random.Random(seed)
    scale = max_len / 8192
    return [
        rng.randint(10, 60) + int(AUDIO_TOKENS_PER_S * rng.lognormvariate(1.4, 0.8) * 8 * scale) + 10
        for _ in range(count)
    ]


def batches_for(mode: str, sequences: list[TokenSequence], max_len: int, rows: int, seed: int):
    if mode == "pack":
        blocks, stats = apply_length_policy(sequences, max_len, "pack")
        random.Random(seed).shuffle(blocks)
        return [collate_packed(blocks[i : i + rows], max_len, 0) for i in range(0, len(blocks), rows)], stats
    policy = "filter" if mode == "pad_to_longest" else "truncate"
    kept, stats = apply_length_policy(sequences, max_len, policy, batch_size=rows, group_by_length=False)
    random.Random(seed).shuffle(kept)
    batches = []
    for i in range(0, len(kept), rows):
        batch = collate_padded(kept[i : i + rows], 0)
        if mode == "truncate_pad_to_max":  # every row padded to max_len, as padding="max_length"
            pad = max_len - batch["input_ids"].shape[1]
            batch = {
                k: torch.nn.functional.pad(v, (0, pad), value=-100 if k == "labels" else 0)
                for k, v in batch.items()
            }
        batches.append(batch)
    return batches, stats


def useful_tokens(batch: dict[str, torch.Tensor]) -> int:
    if batch["attention_mask"].dim() == 4:  # packed: real tokens attend to themselves and are not pad
        return int((batch["input_ids"] != 0).sum())
    return int(batch["attention_mask"].sum())


def run_mode(model, optimizer, batches, steps: int, warmup: int) -> tuple[float, float]:
    """(useful tokens/s, padding fraction of the timed batches)."""
    timed_useful = timed_total = 0
    start = None
    for index, batch in enumerate(batches[: warmup + steps]):
        if index == warmup:
            start = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if index >= warmup:
            timed_useful += useful_tokens(batch)
            timed_total += batch["input_ids"].numel()
    seconds = time.perf_counter() - start
    return timed_useful / seconds, 1 - timed_useful / timed_total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=2, help="sequences (or packed blocks) per batch")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write", type=Path, help="update this section of docs/benchmarks.md")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(torch.get_num_threads())
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.max_len,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lengths = speech_like_lengths(args.samples, args.max_len, seed=0)
    rng = random.Random(1)
    sequences = [
        TokenSequence(ids, ids) for ids in ([rng.randrange(1, 512) for _ in range(n)] for n in lengths)
    ]
    modes = ["pad_to_longest", "truncate_pad_to_max", "pack"]
    prepared = {mode: batches_for(mode, sequences, args.max_len, args.rows, seed=2) for mode in modes}
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
    for repeat in range(args.repeats):
        for mode in modes:
            batches = prepared[mode][0]
            offset = (repeat * (args.steps + 3)) % max(1, len(batches) - args.steps - 3)
            results[mode].append(run_mode(model, optimizer, batches[offset:], args.steps, warmup=3))
            print(
                f"repeat {repeat + 1} {mode}: {results[mode][-1][0]:.0f} useful tokens/s, "
                f"padding {results[mode][-1][1]:.1%}",
                flush=True,
            )

    pad_speed = statistics.median(r[0] for r in results["pad_to_longest"])
    rows = []
    for mode in modes:
        speed = statistics.median(r[0] for r in results[mode])
        padding = statistics.median(r[1] for r in results[mode])
        stats = prepared[mode][1]
        cells = [
            mode,
            f"{speed:.0f}",
            f"{speed / pad_speed:.2f}x",
            f"{padding:.1%}",
            stats.dropped,
            stats.truncated,
        ]
        rows.append("| " + " | ".join(map(str, cells)) + " |")
    pack_speed = statistics.median(r[0] for r in results["pack"])
    pack_padding = statistics.median(r[1] for r in results["pack"])
    verdict = "PASS" if pack_padding < 0.05 and pack_speed >= 1.5 * pad_speed else "FAIL"
    stats = prepared["pack"][1]
    command = "python " + " ".join(shlex.quote(a) for a in ["benchmarks/tts_packing.py", *sys.argv[1:]])
    machine = (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads; torch "
        f"{torch.__version__}, Python {platform.python_version()}; "
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    section = f"""{SECTION}

Written by `benchmarks/tts_packing.py`. Command: `{command}`

Machine: {machine}.

{args.samples} speech-like sequences (text + log-normal audio duration at {AUDIO_TOKENS_PER_S} tokens/s,
scaled to max_seq_length {args.max_len}): length min {stats.min}, median {stats.median:g}, p95 {stats.p95:g},
max {stats.max}. Tiny Llama (2 layers, hidden 128, SDPA), AdamW, {args.rows} rows per batch,
{args.steps} timed steps after 3 warm-up steps per mode, modes alternating, {args.repeats} repeats; cells
are medians. Useful tokens = real tokens of samples; padding = pad share of the timed batches.
Samples over the limit are dropped by pad_to_longest and pack, cut by truncate.

| mode | useful tokens/s | vs pad_to_longest | padding | dropped | truncated |
|---|---|---|---|---|---|
{chr(10).join(rows)}

Target: pack wastes < 5% and trains >= 1.5x the useful tokens/s of pad_to_longest: **{verdict}**.
"""
    print(section)
    if args.write:
        write_section(args.write, SECTION, section)
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
