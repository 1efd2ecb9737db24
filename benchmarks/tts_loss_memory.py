"""Peak memory and CPU time of one tts_lm training step at the real Orpheus vocabulary: the chunked loss
(framer_ds/tasks/tts_lm/chunked_loss.py, what tts_lm trains with) against the plain full-logits loss
(`F.cross_entropy(logits.float(), ...)`, what it did before and what transformers does).

Why: at 156,939 ids one 8192-token sequence has 4.9 GB of fp32 logits and the plain step peaked near
15 GB for a tiny model, so the real vocabulary at 8192 tokens did not fit a laptop or a small GPU. The
goal is a peak under 4 GB. Each mode runs in a fresh child process (one thread) so its peak RSS
(`ru_maxrss`) is its own; the table gives the peak over the RSS before the step (the model and the
batch) too. CPU-seconds are user + system time of the step alone.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

SECTION = "## tts_loss_memory"
ORPHEUS_VOCAB = 156_939


def rss_now_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(mode: str, tokens: int, vocab: int) -> dict:
    """One forward + backward + AdamW step in this process; its memory and CPU time."""
    import torch
    import torch.nn.functional as F
    from transformers import LlamaConfig, LlamaForCausalLM

    from framer_ds.tasks.tts_lm.chunked_loss import ChunkedHeadLoss

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=tokens, attn_implementation="sdpa",
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, vocab, (1, tokens))
    before = rss_now_mb()
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.perf_counter()
    if mode == "full":
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), ids[:, 1:].reshape(-1), reduction="sum")
    else:
        losses, _ = ChunkedHeadLoss()(model, {"input_ids": ids}, ids)
        loss = losses.sum()
    loss.backward()
    optimizer.step()
    after = resource.getrusage(resource.RUSAGE_SELF)
    seconds = (after.ru_utime - cpu.ru_utime) + (after.ru_stime - cpu.ru_stime)
    return {
        "mode": mode,
        "loss": float(loss) / (tokens - 1),
        "peak_mb": after.ru_maxrss / 1024,
        "before_mb": before,
        "cpu_s": seconds,
        "wall_s": time.perf_counter() - wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="4096,8192", help="comma-separated sequence lengths")
    parser.add_argument("--vocab", type=int, default=ORPHEUS_VOCAB)
    parser.add_argument("--modes", default="chunked,full", help="comma-separated: chunked, full")
    parser.add_argument(
        "--full-max-tokens",
        type=int,
        default=4096,
        help="skip the full-logits mode above this length (at 8192 it needs ~15 GB free)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--write", type=Path, help="update this section of docs/benchmarks.md")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, int(args.tokens), args.vocab)))
        return 0

    results = []
    runs = [(int(t), m) for t in args.tokens.split(",") for m in args.modes.split(",")]
    for tokens, mode in runs:
        if mode == "full" and tokens > args.full_max_tokens:
            continue
        argv = [
            sys.executable,
            __file__,
            "--child",
            mode,
            "--tokens",
            str(tokens),
            "--vocab",
            str(args.vocab),
        ]
        proc = subprocess.run(
            argv, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode
        results.append({"tokens": tokens, **json.loads(proc.stdout.strip().splitlines()[-1])})
        print(results[-1], flush=True)

    rows = [
        f"| {r['tokens']} | {r['mode']} | {r['peak_mb'] / 1024:.2f} | "
        f"{(r['peak_mb'] - r['before_mb']) / 1024:.2f} | {r['cpu_s']:.1f} | "
        f"{r['tokens'] / r['cpu_s']:.0f} | {r['loss']:.4f} |"
        for r in results
    ]
    longest = max(int(t) for t in args.tokens.split(","))
    chunked = next((r for r in results if r["mode"] == "chunked" and r["tokens"] == longest), None)
    verdict = "PASS" if chunked and chunked["peak_mb"] < 4096 else "FAIL"
    command = "python " + " ".join(shlex.quote(a) for a in ["benchmarks/tts_loss_memory.py", *sys.argv[1:]])
    import torch

    machine = (
        f"{platform.processor() or platform.machine()}, 1 torch thread per child; torch {torch.__version__}, "
        f"Python {platform.python_version()}; {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    section = f"""{SECTION}

Written by `benchmarks/tts_loss_memory.py`. Command: `OMP_NUM_THREADS=1 {command}`

Machine: {machine}.

One training step (forward, backward, AdamW) of a tiny Llama (2 layers, hidden 64, SDPA, fp32) on one
sequence at vocabulary {args.vocab:,}, each length and mode in a fresh process. `full`: the plain
loss from [B, T, V] logits and their fp32 copy (tts_lm before issue 37, and transformers' own loss);
`chunked`: tts_lm's loss from the final hidden states, {_chunk(args.vocab)} tokens per checkpointed chunk.
Peak = the process's peak RSS; over start = that minus the RSS before the step (model, optimizer, batch).
`full` runs up to {args.full_max_tokens} tokens only (`--full-max-tokens`): its peak grows with the
logits, linearly in the length, and at 8192 (~2x the 4096 figure) it does not fit beside other jobs on a
23 GB machine.

| tokens | loss | peak RSS (GB) | over start (GB) | step CPU-s | tokens per CPU-s | loss value |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Target: the chunked step at {longest} tokens peaks under 4 GB: **{verdict}**.
"""
    print(section)
    if args.write:
        from report import write_section

        write_section(args.write, SECTION, section)
    return 0 if verdict == "PASS" else 1


def _chunk(vocab: int) -> int:
    from framer_ds.tasks.tts_lm.chunked_loss import chunk_tokens

    return chunk_tokens(vocab)


if __name__ == "__main__":
    raise SystemExit(main())
