"""`model.source.builtin: tiny_llama` and `data.source.builtin: tiny_speech`: everything the CPU demo
and the tests need, built offline in the cache on first use.

The tokenizer is a byte-level BPE trained on the demo sentences and saved as a transformers fast
tokenizer; the model is a 2-layer Llama saved with `save_pretrained`; the codec is a random SNAC with the
24 kHz structure. Each word of an utterance is a tone of its own pitch, encoded with that codec, so the
text really determines the audio codes and the loss falls well below the unigram level in a few steps.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

from framer_ds.storage.atomic import atomic_write_text, build_once
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.tts_lm.snac_codec import create_tiny_codec, encode_batch, load_codec

MARKER = ".framer_tiny_tts_complete"
"""In the root once model/, codec/ and data/ are all there (a set built before the parts were built
apart carries only this one)."""
PART_MARKER = ".framer_tiny_tts_part_complete"
"""In each of model/, codec/ and data/ once it is built (each is built once, on its own: `framer-ds plan`
needs only model/, and the speech set's encoding is most of the build)."""
WORDS = [
    "hello",
    "world",
    "speech",
    "model",
    "voice",
    "test",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "this",
    "is",
    "a",
    "small",
    "demo",
    "of",
    "training",
    "text",
    "to",
    "audio",
    "tokens",
    "with",
    "packing",
    "and",
    "length",
    "groups",
]
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
WORD_SECONDS = 0.25
TRAIN_UTTERANCES, EVAL_UTTERANCES = 160, 16

TINY_LLAMA = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}


def tiny_root() -> Path:
    return default_cache_dir() / "tiny_tts"


def ensure_tiny_tts(root: Path | None = None) -> Path:
    """The model/, codec/ and data/ folders under `root` (default <cache>/tiny_tts), each built once."""
    root = root or tiny_root()
    if (root / MARKER).is_file():
        return root
    ensure_tiny_model(root)
    codec = build_once(root / "codec", PART_MARKER, create_tiny_codec, "tiny SNAC codec")
    build_once(root / "data", PART_MARKER, lambda staging: _build_data(staging, codec), "tiny speech set")
    atomic_write_text(root / MARKER, "complete\n")
    return root


def ensure_tiny_model(root: Path | None = None) -> Path:
    """Only the model/ folder (the tiny Llama and its tokenizer) under `root`, built once: what a plan or
    a census reads (its config.json and vocabulary), without the codec and the encoded speech set."""
    root = root or tiny_root()
    if (root / MARKER).is_file():
        return root / "model"
    return build_once(root / "model", PART_MARKER, _build_model, "tiny Llama")


def sentences(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(count)]


def _build_model(staging: Path) -> None:
    save_tiny_llama(staging, build_tokenizer(sentences(400, seed=99)))


def _build_data(data: Path, codec_dir: Path) -> None:
    codec = load_codec(codec_dir)
    for name, count, seed in (("train", TRAIN_UTTERANCES, 0), ("eval", EVAL_UTTERANCES, 1)):
        texts = sentences(count, seed)
        codes = []
        for start in range(0, count, 16):
            batch = texts[start : start + 16]
            codes += encode_batch(codec, [spoken(text, codec.sampling_rate) for text in batch])
        with (data / f"{name}.jsonl").open("w") as out:
            for index, (text, utterance) in enumerate(zip(texts, codes, strict=True)):
                speaker = "ana" if index % 2 else "ben"
                out.write(json.dumps({"text": text, "codes": utterance, "speaker": speaker}) + "\n")


def spoken(text: str, sample_rate: int) -> np.ndarray:
    """Each word a tone of its own pitch (a stand-in for speech whose sound follows its text)."""
    pieces = []
    n = int(WORD_SECONDS * sample_rate)
    t = np.arange(n) / sample_rate
    for word in text.split():
        pitch = 150.0 * 2 ** (WORDS.index(word) / 6) if word in WORDS else 100.0
        pieces.append(0.4 * np.sin(2 * np.pi * pitch * t) * np.hanning(n))
    return np.concatenate(pieces).astype(np.float32)


def build_tokenizer(corpus: list[str]):
    """A byte-level BPE fast tokenizer with a BOS and an EOS, trained on `corpus`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    core.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token=EOS)


def save_tiny_llama(directory: Path, tokenizer, seed: int = 0, **overrides) -> Path:
    """A random tiny Llama with `tokenizer`'s vocabulary, saved with the tokenizer as a user's would be."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **{**TINY_LLAMA, **overrides},
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
