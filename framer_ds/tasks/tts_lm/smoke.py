"""`framer-ds smoke` for tts_lm recipes (tasks/smoke.py says what a smoke keeps and swaps).

The base: the causal LM its config.json describes (Granite 4.0 1B's hybrid stack as the recipe names
it) at width 32 in 4 heads (the key/value head ratio kept) and 2 layers, random, with the same
vocabulary: a stand-in tokenizer of exactly the base's length whose BOS, EOS and pad sit at the base's
ids (a byte-level BPE over the synthetic texts, the rest of the ids filler tokens), so the recipe's
tokens land after it as they will (`special_tokens.preset: auto`). A base that is a framer_ds tts_lm
export (a path ending in final/, as lora_sft's is the pretraining run's) carries the recipe's tokens
already, as that export will. The codec: a random SNAC with the 24 kHz structure (tts_lm/snac_codec.py).
The data: rows in the recipe's format and file type - `codes` (text + three SNAC code lists + speaker)
or `audio` (a manifest of wav files + text + speaker) - a few short utterances; data.max_seq_length and
the length policy stay.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.storage.atomic import build_once
from framer_ds.tasks.smoke import (
    SmokeHooks,
    SmokeStandIns,
    architecture_source,
    read_config,
    stand_in_dir,
    tiny_note,
)

ROWS = {"train": 12, "eval": 4}
SHORT_FRAMES = (8, 16)  # codec frames of an utterance (~12 a second): 0.7-1.3 s
PACKED_FRAMES = (90, 110)  # ~8 s: packed recipes fill their blocks with fewer rows
GATE_TEXTS, GATE_TOKENS = 1, 140  # the quality gates' texts and tokens (20 codec frames)
SPEAKERS = ("ana", "ben")
SAMPLE_RATE = 24000


class TtsSmoke(SmokeHooks):
    """The tts_lm task's smoke hooks (a mixin of its task, which supplies `config`)."""

    config: Any

    def smoke_stand_ins(self, root: Path) -> SmokeStandIns:
        found = SmokeStandIns()
        model = self.config.model
        if model.source.path is not None:
            source = architecture_source(self.config, model.source.path)
            if source is None:
                problem = f"{model.source.path} is not on disk and framer_ds ships no architecture for it"
                raise ConfigError([ConfigProblem("model.source.path", problem)], "smoke")
            folder, name = source
            export = Path(model.source.path).name == "final"
            key = {"what": "LM", "export": export, "config": _digest(folder / "config.json")}
            out = build_once(
                stand_in_dir(root, "bases", key),
                ".framer_smoke_lm_complete",
                lambda staging: _save_tiny_lm(staging, read_config(folder), export),
                "tiny LM stand-in",
            )
            found.overrides.append(f"model.source.path={out}")
            what = "causal LM with the recipe's tokens (a tts_lm export)" if export else "causal LM"
            found.swapped.append(tiny_note("model.source.path", model.source.path, name, out, what))
        if model.codec.path is not None and not Path(model.codec.path).exists():
            from framer_ds.tasks.tts_lm.snac_codec import create_tiny_codec

            out = build_once(
                stand_in_dir(root, "bases", {"what": "SNAC"}),
                ".framer_smoke_snac_complete",
                lambda staging: create_tiny_codec(staging),
                "tiny SNAC stand-in",
            )
            found.overrides.append(f"model.codec.path={out}")
            found.swapped.append(
                f"model.codec.path: {model.codec.path} -> {out} (a random SNAC, 24 kHz layout)"
            )
        self._smoke_rows(root, found)
        self._smoke_quality_gates(found)
        return found

    def _smoke_quality_gates(self, found: SmokeStandIns) -> None:
        """`framer-ds eval` speaks `count` held-out texts up to `max_new_tokens` each and scores them with
        an ASR and a speaker encoder: minutes on a CPU at any width (a random model never ends its
        speech early), so one short text keeps the path."""
        gates = self.config.model.quality_eval
        if not gates.enabled:
            return
        small = {
            "count": min(gates.count, GATE_TEXTS),
            "max_new_tokens": min(gates.max_new_tokens, GATE_TOKENS),
        }
        changed = {k: (getattr(gates, k), v) for k, v in small.items() if getattr(gates, k) != v}
        if changed:
            found.overrides += [f"model.quality_eval.{k}={new}" for k, (_, new) in changed.items()]
            found.shrunk.append(
                "model.quality_eval: "
                + ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
                + ": the quality gates speak each held-out text to the end and score it with an ASR and a "
                "speaker encoder, ~1 min a text of 1200 tokens on this CPU at any width"
            )

    def _smoke_rows(self, root: Path, found: SmokeStandIns) -> None:
        """Synthetic rows for data.source.path and data.eval when they are not on disk."""
        data = self.config.data
        for key, path, split in (
            ("data.source.path", data.source.path, "train"),
            ("data.eval", data.eval, "eval"),
        ):
            if path is None or Path(path).exists():
                continue
            if data.format == "tokens":
                problem = f"{path} is not on disk; the smoke generates rows of format codes or audio"
                raise ConfigError([ConfigProblem(key, problem)], "smoke")
            rows, frames = ROWS[split], SHORT_FRAMES
            if data.length_policy in ("pack", "split") and split == "train":
                # packed into max_seq_length blocks: 3 blocks (a micro-batch on each of 2 ranks and more)
                frames = PACKED_FRAMES
                rows = max(rows, -(-3 * data.max_seq_length // (7 * PACKED_FRAMES[0])) + 2)
            shape = {"format": data.format, "name": Path(path).name, "split": split, "rows": rows}
            shape["frames"] = list(frames)
            folder = build_once(
                stand_in_dir(root, "speech", {**shape, "columns": self._columns()}),
                ".framer_smoke_rows_complete",
                lambda staging, shape=shape: self._write_rows(staging, shape),
                "synthetic speech rows",
            )
            out = folder / Path(path).name
            found.overrides.append(f"{key}={out}")
            found.swapped.append(
                f"{key}: {path} is not on disk -> {out} ({rows} synthetic utterances, format "
                f"{data.format}; data.max_seq_length {data.max_seq_length} and length_policy "
                f"{data.length_policy} stay)"
            )

    def _columns(self) -> dict[str, str | None]:
        data = self.config.data
        return {
            "text": data.text_column,
            "codes": data.codes_column,
            "audio": data.audio_column,
            "speaker": data.speaker_column,
        }

    def _write_rows(self, staging: Path, shape: dict[str, Any]) -> None:
        rng = np.random.default_rng(0 if shape["split"] == "train" else 1)
        columns = self._columns()
        rows = []
        for index in range(shape["rows"]):
            text = " ".join(rng.choice(["hello", "speech", "voice", "quick", "brown", "fox"], 3))
            row: dict[str, Any] = {columns["text"]: text}
            if columns["speaker"]:
                row[columns["speaker"]] = SPEAKERS[index % len(SPEAKERS)]
            frames = int(rng.integers(*shape["frames"]))  # ~12 codec frames a second
            if shape["format"] == "codes":
                row[columns["codes"]] = [rng.integers(0, 4096, frames * n).tolist() for n in (1, 2, 4)]
            else:
                wav = Path("wavs") / f"{shape['split']}_{index:03d}.wav"
                _write_wav(staging / wav, frames, rng)
                row[columns["audio"]] = str(wav)
            rows.append(row)
        _write_table(staging / shape["name"], rows)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _write_wav(path: Path, frames: int, rng: np.random.Generator) -> None:
    import soundfile

    seconds = frames / 12
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    tone = 0.3 * np.sin(2 * np.pi * float(rng.uniform(120, 400)) * t)
    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(path, tone.astype(np.float32), SAMPLE_RATE)


def _write_table(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows as the file type the recipe's path names: Parquet, else JSON lines."""
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _save_tiny_lm(staging: Path, config: dict[str, Any], export: bool) -> None:
    """The causal LM of `config` at width 32 (module docstring), its stand-in tokenizer beside it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype", "dtype")}
    heads, kv = fields.get("num_attention_heads", 4), fields.get("num_key_value_heads") or 1
    layers = 2
    small = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": max(1, 4 * kv // heads),
    }
    if "shared_intermediate_size" in fields:
        small["shared_intermediate_size"] = 64
    if isinstance(fields.get("layer_types"), list):
        small["layer_types"] = fields["layer_types"][:layers]
    if "mamba_n_heads" in fields:
        small |= {"mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 16, "mamba_n_groups": 1}
    model_config = AutoConfig.for_model(fields.pop("model_type"), **{**fields, **small})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config)
    tokenizer = stand_in_tokenizer(
        model_config.vocab_size,
        model_config.bos_token_id,
        model_config.eos_token_id,
        model_config.pad_token_id,
    )
    if export:
        from framer_ds.tasks.tts_lm.model_setup import EMBEDDING_MULTIPLE
        from framer_ds.tasks.tts_lm.vocabulary import extend_tokenizer

        extend_tokenizer(tokenizer)
        model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=EMBEDDING_MULTIPLE)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)


def stand_in_tokenizer(vocab_size: int, bos: int | None, eos: int | None, pad: int | None):
    """A fast tokenizer of exactly `vocab_size` ids: a byte-level BPE over a few words, its special
    tokens at the base's ids, filler tokens elsewhere (never produced by the merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = ["hello speech voice quick brown fox jumps over the lazy dog"] * 4
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(corpus, trainer)
    learnt = json.loads(core.to_str())["model"]
    special = {
        i: name
        for i, name in ((pad, "<|pad|>"), (bos, "<|begin_of_text|>"), (eos, "<|end_of_text|>"))
        if i is not None
    }
    pieces = [p for p, _ in sorted(learnt["vocab"].items(), key=lambda item: item[1])]
    free = (i for i in range(vocab_size) if i not in special)
    vocab = {piece: next(free) for piece in pieces}
    vocab |= {name: i for i, name in special.items()}
    taken = set(vocab.values())
    vocab |= {f"<|filler_{i}|>": i for i in range(vocab_size) if i not in taken}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learnt["merges"]]
    full = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    full.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    full.decoder = decoders.ByteLevel()
    roles = {"pad_token": special.get(pad), "bos_token": special.get(bos), "eos_token": special.get(eos)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=full, **{k: v for k, v in roles.items() if v})
    assert len(tokenizer) == vocab_size, (len(tokenizer), vocab_size)
    return tokenizer
