"""Learned tokens per CPU-second: tts_lm's data path and loss against the VyvoTTS-style recipe, on the
same speech-like samples (issue 37's comparison, goal >= 1.5x with packing, 0 tokens dropped).

- recipe: samples over max_seq_length dropped, random batches padded to their longest sample,
  transformers' own loss (`model(..., labels=...).loss`, full logits).
- pack: tts_lm's `length_policy: pack` blocks (block-diagonal mask) and its chunked loss.
- split: tts_lm's `length_policy: split` (long utterances cut into prompt + continuation pieces, nothing
  dropped), length-grouped padded batches, its chunked loss.
Same tiny Llama (SDPA, fp32), same rows per batch, AdamW, one thread, modes alternating so machine noise
hits all of them. A learned token is one whose label counts in the loss; CPU-seconds are this process's
(`time.process_time`), so other load on the machine does not count against a mode.
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
from functools import partial
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from tts_packing import speech_like_lengths

from framer_ds.tasks.tts_lm.chunked_loss import ChunkedHeadLoss
from framer_ds.tasks.tts_lm.splitting import split_sequence
from framer_ds.tasks.tts_lm.token_batches import collate_packed, collate_padded
from framer_ds.tasks.tts_lm.token_sequences import (
    SpecialTokens,
    apply_length_policy,
    build_sequence,
    length_grouped_order,
)

SECTION = "## tts_throughput"
SPECIAL = SpecialTokens(None, 1, 2, 3, 4, 5, 6, 7, 0, 10)  # small ids: the audio codes from 10
MODES = ("recipe", "pack", "split")


def speech_samples(count: int, max_len: int, vocab: int, seed: int):
    """Utterances in the recipe's layout whose lengths follow tts_packing's speech-like distribution."""
    rng = random.Random(seed)
    samples = []
    for length in speech_like_lengths(count, max_len, seed):
        text = [rng.randrange(11, vocab) for _ in range(rng.randint(10, 40))]
        frames = max(1, (length - len(text) - 8) // 7)
        audio = [rng.randrange(SPECIAL.audio_start, vocab) for _ in range(7 * frames)]
        samples.append(build_sequence(text, audio, SPECIAL))
    return samples


def batches_for(mode: str, samples, max_len: int, rows: int, seed: int):
    if mode == "pack":
        blocks, stats = apply_length_policy(samples, max_len, "pack")
        random.Random(seed).shuffle(blocks)
        return [collate_packed(blocks[i : i + rows], max_len, 0) for i in range(0, len(blocks), rows)], stats
    if mode == "recipe":
        kept, stats = apply_length_policy(samples, max_len, "filter", rows, group_by_length=False)
        random.Random(seed).shuffle(kept)
    else:
        splitter = partial(
            split_sequence, max_len=max_len, start_of_speech=SPECIAL.start_of_speech,
            end_of_speech=SPECIAL.end_of_speech,
        )  # fmt: skip
        pieces, stats = apply_length_policy(samples, max_len, "split", rows, True, splitter)
        kept = [pieces[i] for i in length_grouped_order([len(p) for p in pieces], rows, seed, 0)]
    return [collate_padded(kept[i : i + rows], 0) for i in range(0, len(kept), rows)], stats


def learned_tokens(batch) -> int:
    return int((batch["labels"][:, 1:] != -100).sum())


def step(mode: str, model, batch, head_loss: ChunkedHeadLoss) -> torch.Tensor:
    if mode == "recipe":
        return model(**batch, use_cache=False).loss
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
    losses, _ = head_loss(model, inputs, batch["labels"])
    return losses.sum() / max(learned_tokens(batch), 1)


def run_mode(mode: str, model, optimizer, batches, steps: int, warmup: int) -> float:
    """Learned tokens per CPU-second over `steps` batches after `warmup`."""
    head_loss = ChunkedHeadLoss()
    learned, start = 0, 0.0
    for index, batch in enumerate(batches[: warmup + steps]):
        if index == warmup:
            start = time.process_time()
        step(mode, model, batch, head_loss).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if index >= warmup:
            learned += learned_tokens(batch)
    return learned / (time.process_time() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--rows", type=int, default=2, help="sequences (or packed blocks) per batch")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--write", type=Path, help="update this section of docs/benchmarks.md")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=args.max_len,
        attn_implementation="sdpa",
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    samples = speech_samples(args.samples, args.max_len, args.vocab, seed=0)
    total_learned = sum(sum(1 for label in s.labels[1:] if label != -100) for s in samples)
    prepared = {mode: batches_for(mode, samples, args.max_len, args.rows, seed=2) for mode in MODES}
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    for repeat in range(args.repeats):
        for mode in MODES:
            batches = prepared[mode][0]
            offset = (repeat * (args.steps + 2)) % max(1, len(batches) - args.steps - 2)
            results[mode].append(run_mode(mode, model, optimizer, batches[offset:], args.steps, warmup=2))
            print(f"repeat {repeat + 1} {mode}: {results[mode][-1]:.0f} learned tokens per CPU-s", flush=True)

    recipe = statistics.median(results["recipe"])
    rows = []
    for mode in MODES:
        speed = statistics.median(results[mode])
        stats = prepared[mode][1]
        kept = sum(learned_tokens(b) for b in prepared[mode][0])
        cells = [
            mode,
            f"{speed:.0f}",
            f"{speed / recipe:.2f}x",
            stats.dropped_tokens,
            f"{kept}/{total_learned}",
        ]
        rows.append("| " + " | ".join(map(str, cells)) + " |")
    command = "python " + " ".join(shlex.quote(a) for a in ["benchmarks/tts_throughput.py", *sys.argv[1:]])
    machine = (
        f"{platform.processor() or platform.machine()}, 1 torch thread; torch {torch.__version__}, Python "
        f"{platform.python_version()}; {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    lengths = prepared["recipe"][1]
    section = f"""{SECTION}

Written by `benchmarks/tts_throughput.py`. Command: `OMP_NUM_THREADS=1 {command}`

Machine: {machine}.

{args.samples} speech-like utterances in the recipe's token layout (tts_packing's length distribution at
max_seq_length {args.max_len}: length min {lengths.min}, median {lengths.median:g}, p95 {lengths.p95:g}, max
{lengths.max}); tiny Llama (2 layers, hidden 128, vocabulary {args.vocab}, SDPA, fp32), AdamW, {args.rows}
rows per batch, {args.steps} timed steps after 2 warm-up steps per mode, modes alternating, {args.repeats}
repeats; cells are medians. Learned tokens = labels the loss counts; "kept" = learned tokens in all the
mode's batches over those of the whole data set (split repeats each piece's prompt, unlearned).

| mode | learned tokens per CPU-s | vs recipe | tokens dropped | learned tokens kept |
|---|---|---|---|---|
{chr(10).join(rows)}

Goal (issue 37): >= 1.5x the recipe with packing, 0 tokens dropped; the table says where it stands.
"""
    print(section)
    if args.write:
        from report import write_section

        write_section(args.write, SECTION, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
