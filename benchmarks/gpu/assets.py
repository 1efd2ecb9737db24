"""What the GPU suite trains on, made on the machine that runs it (nothing is downloaded).

Why generated: the suite measures memory and speed at the sizes users train, which depend on shapes, not
on learned weights. A random SVD of the real size (`create_full_size_svd`), a ~1B Llama built from its
config, and long synthetic speech rows whose lengths make padding cost what it costs on real data.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from framer_ds.storage.atomic import build_once

# The SVD and TTS builders are imported where they are called: importing them pulls diffusers and the SNAC
# codec (~8 s on 2 cores), which every step's process (cells.py imports this module) paid on start-up.

# A ~1.1B Llama (TinyLlama-1.1B's shape) standing in for the recipe's ~1B Granite: full fine-tune at 8192.
LLAMA_1B = {
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}
LLAMA_SMOKE = {
    **LLAMA_1B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}

SNAC_FRAME_TOKENS = 7  # one SNAC frame: 1 + 2 + 4 codes (docs/architecture.md, TTS tokens)


def full_size_svd(root: Path) -> Path:
    """A random SVD checkpoint of the real size under `root` (about 4.5 GB in bf16), built once."""
    from framer_ds.tasks.video_lora.svd.tiny import create_full_size_svd

    return create_full_size_svd(root / "svd_full_size")


def speech_tokenizer() -> Path:
    """The tiny TTS set's tokenizer (built once in the cache): the 1B model is built from LLAMA_1B with
    it, so the vocabulary is the recipe's layout (7 x 4096 audio codes + markers) on a small text part."""
    from framer_ds.tasks.tts_lm.tiny import ensure_tiny_tts

    return ensure_tiny_tts() / "model"


def long_speech_rows(root: Path, rows: int, max_tokens: int, seed: int = 0) -> Path:
    """`rows` utterances in the `codes` format (text + three SNAC code lists), audio lengths uniform
    between a quarter and nearly all of `max_tokens`: padded batches then waste what real long-form
    speech wastes, and packing has something to win back. Written once per (rows, max_tokens)."""
    target = root / f"long_speech_{rows}x{max_tokens}"

    def build(staging: Path) -> None:
        from framer_ds.tasks.tts_lm.tiny import sentences

        rng = random.Random(seed)
        texts = sentences(rows, seed)
        with (staging / "train.jsonl").open("w") as out:
            for text in texts:
                frames = rng.randint(
                    max_tokens // (4 * SNAC_FRAME_TOKENS), (max_tokens - 64) // SNAC_FRAME_TOKENS
                )
                codes = [[rng.randrange(4096) for _ in range(frames * n)] for n in (1, 2, 4)]
                out.write(json.dumps({"text": text, "codes": codes}) + "\n")

    return build_once(target, ".complete", build, "long synthetic speech rows") / "train.jsonl"
