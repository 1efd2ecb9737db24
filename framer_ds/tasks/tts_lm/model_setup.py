"""Where a tts_lm run's model, tokenizer and codec come from, and how the model is built: loaded or
fresh, its embeddings resized to the extended tokenizer, then fully trained or wrapped in LoRA whose
adapter also trains (and saves) the embeddings and head, since the new token rows start untrained."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.pretrained import build_fresh, building_empty, load_pretrained
from framer_ds.tasks.tts_lm import vocabulary
from framer_ds.tasks.tts_lm.audio_tokens import AudioTokenLayout
from framer_ds.tasks.tts_lm.tiny import ensure_tiny_model, ensure_tiny_tts, tiny_root
from framer_ds.tasks.tts_lm.token_sequences import SpecialTokens

EMBEDDING_MULTIPLE = 64  # rows padded to a multiple of 64: faster matmuls, same tokens


@dataclass
class TtsAssets:
    """Paths of the model, tokenizer and codec, and the extended tokenizer and layout (loaded lazily)."""

    model_dir: Path | None  # None: a fresh model from model.source.config
    tokenizer_dir: Path
    codec_dir: Path | None
    model_config: dict
    options: object  # TtsModelConfig
    builtin: bool

    @classmethod
    def from_config(cls, config) -> TtsAssets:
        model = config.model
        if model.source.builtin is not None:
            root = tiny_root()
            return cls(root / "model", root / "model", model.codec.path or root / "codec", {}, model, True)
        model_dir = model.source.path
        tokenizer_dir = model.tokenizer or model_dir
        return cls(model_dir, tokenizer_dir, model.codec.path, model.source.fresh_config or {}, model, False)

    def ensure_builtin(self) -> None:
        if self.builtin:
            ensure_tiny_tts()

    def ensure_builtin_model(self) -> None:
        """The built-in tiny model and tokenizer only (what a plan reads), not its codec or speech set."""
        if self.builtin:
            ensure_tiny_model()

    def problems(self) -> list[ConfigProblem]:
        problems = []
        if self.builtin:
            return problems
        if self.model_dir is not None and not (self.model_dir / "config.json").is_file():
            problems.append(
                ConfigProblem(
                    "model.source.path",
                    f"{self.model_dir} is not a saved model directory (no config.json). Download it once, "
                    "e.g. `huggingface-cli download ibm-granite/granite-3.3-2b-base --local-dir DIR`, and "
                    "point this key at DIR",
                )
            )
        if not any((self.tokenizer_dir / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
            problems.append(
                ConfigProblem(
                    "model.tokenizer" if self.options.tokenizer else "model.source.path",
                    f"{self.tokenizer_dir} holds no tokenizer (tokenizer.json / tokenizer_config.json)",
                )
            )
        if self.codec_dir is None and self.options.samples.every:
            problems.append(
                ConfigProblem(
                    "model.samples.every",
                    f"{self.options.samples.every} writes audio samples, which need the SNAC codec: set "
                    "model.codec.path (`huggingface-cli download hubertsiuzdak/snac_24khz --local-dir DIR`) "
                    "or model.samples.every: 0",
                )
            )
        if self.codec_dir is not None and not (self.codec_dir / "config.json").is_file():
            problems.append(
                ConfigProblem(
                    "model.codec.path",
                    f"{self.codec_dir} is not a SNAC directory (no config.json); `huggingface-cli download "
                    "hubertsiuzdak/snac_24khz --local-dir DIR`",
                )
            )
        return problems

    def layout_problems(self) -> list[ConfigProblem]:
        from transformers import AutoTokenizer

        base = AutoTokenizer.from_pretrained(self.tokenizer_dir)
        return vocabulary.layout_problems(self.options.special_tokens, base)

    def vocab_problems(self) -> list[ConfigProblem]:
        """A fresh model's `vocab_size` may pad the embeddings past the extended tokenizer (Llama-3-based
        TTS checkpoints ship padded), never cut tokens off it."""
        wanted = self.model_config.get("vocab_size")
        if wanted is None or wanted >= self.vocabulary_size:
            return []
        return [
            ConfigProblem(
                "model.source.config.vocab_size",
                f"{wanted} is smaller than the extended tokenizer's {self.vocabulary_size} tokens (base + "
                f"the recipe's {vocabulary.ADDED_TOKENS}); remove the key (the tokenizer's length is "
                f"used) or set it to at least {self.vocabulary_size}",
            )
        ]

    @cached_property
    def tokenizer(self):
        """The tokenizer with the recipe's tokens; its preset checked (ConfigError naming the fix)."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir)
        problems = vocabulary.layout_problems(self.options.special_tokens, tokenizer)
        if problems:
            raise ConfigError(problems, "tokenizer")
        self._special = vocabulary.special_tokens(self.options.special_tokens, tokenizer)
        base = vocabulary.base_length(tokenizer)
        vocabulary.extend_tokenizer(tokenizer)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = vocabulary.custom_token(self._special.pad - base)
        return tokenizer

    @property
    def special(self) -> SpecialTokens:
        if self.tokenizer_absent:
            return self.vocabulary_stand_in[1]
        _ = self.tokenizer
        return self._special

    @property
    def vocabulary_size(self) -> int:
        """Tokens of the extended tokenizer: the embedding rows the model needs."""
        return self.vocabulary_stand_in[0] if self.tokenizer_absent else len(self.tokenizer)

    @property
    def tokenizer_absent(self) -> bool:
        """No tokenizer files (`framer-ds plan` before the download: a shipped architecture holds none)."""
        names = ("tokenizer.json", "tokenizer_config.json")
        return self.model_dir is not None and not any((self.tokenizer_dir / n).is_file() for n in names)

    @cached_property
    def vocabulary_stand_in(self) -> tuple[int, SpecialTokens]:
        """(length, special tokens) of the extended tokenizer from the model's config.json alone: its
        vocab_size as the base vocabulary, its BOS and EOS (or the preset's values)."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(self.model_dir)
        preset = vocabulary.stand_in_layout(
            self.options.special_tokens, config.vocab_size, config.bos_token_id, config.eos_token_id
        )
        special = SpecialTokens.relative_to(preset.tokenizer_length, preset.start_of_text, preset.end_of_text)
        return preset.tokenizer_length + vocabulary.ADDED_TOKENS, special

    def plan_assumptions(self) -> list[str]:
        if not self.tokenizer_absent:
            return []
        length, special = self.vocabulary_stand_in
        added = vocabulary.ADDED_TOKENS
        return [
            f"tokenizer not on disk: assuming a base vocabulary of {length - added:,} "
            f"(preset {self.options.special_tokens.preset!r}; 'auto': the config's vocab_size) with BOS "
            f"{special.start_of_text} and EOS {special.end_of_text}, the recipe's {added:,} tokens after "
            f"it: {length:,} tokens"
        ]

    @property
    def layout(self) -> AudioTokenLayout:
        return vocabulary.audio_layout(self.special)

    def codec(self, device: str):
        """The SNAC codec on `device`, loaded once per device."""
        from framer_ds.tasks.tts_lm.snac_codec import load_codec

        cache = self.__dict__.setdefault("_codecs", {})
        if device not in cache:
            cache[device] = load_codec(self.require_codec("decoding samples"), device)
        return cache[device]

    def require_codec(self, why: str) -> Path:
        if self.codec_dir is None:
            raise ConfigError(
                [ConfigProblem("model.codec.path", f"{why} needs the SNAC codec; set this key")]
            )
        return self.codec_dir


def _load_base(config, assets: TtsAssets) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    attention = {"attn_implementation": config.model.attn_implementation}
    if assets.model_dir is not None:
        return load_pretrained(AutoModelForCausalLM, assets.model_dir, **attention)
    fresh = dict(assets.model_config)
    vocab_size = max(fresh.pop("vocab_size", 0), assets.vocabulary_size)  # >= checked by vocab_problems
    model_config = AutoConfig.for_model(fresh.pop("model_type"), **fresh, vocab_size=vocab_size)
    torch.manual_seed(config.train.seed)
    return build_fresh(lambda: AutoModelForCausalLM.from_config(model_config, **attention))


def resized_base(config, assets: TtsAssets) -> torch.nn.Module:
    """The base model with embedding rows for every token of the extended tokenizer."""
    model = _load_base(config, assets)
    if model.get_input_embeddings().num_embeddings < assets.vocabulary_size:
        # Mean-initialised new rows (transformers' default); a meta model has no values to average.
        model.resize_token_embeddings(
            assets.vocabulary_size, pad_to_multiple_of=EMBEDDING_MULTIPLE, mean_resizing=not building_empty()
        )
    model.config.pad_token_id = assets.special.pad
    return model


def embedding_modules(model: torch.nn.Module) -> list[str]:
    """Names (relative to the model) of its input embedding and, when untied, its output head."""
    names = {module: name for name, module in model.named_modules()}
    found = [names[model.get_input_embeddings()]]
    head = model.get_output_embeddings()
    if head is not None and head.weight is not model.get_input_embeddings().weight:
        found.append(names[head])
    return [name.split(".")[-1] for name in found]


def build_model(config, assets: TtsAssets) -> torch.nn.Module:
    model = resized_base(config, assets)
    if config.train.gradient_checkpointing:
        non_reentrant = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=non_reentrant)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=non_reentrant)
    lora = config.model.lora
    if lora is None:
        return model
    from peft import LoraConfig, get_peft_model

    model.requires_grad_(False)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    peft_config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        init_lora_weights=lora.peft_init(),
        modules_to_save=embedding_modules(model),
        ensure_weight_tying=tied,
        task_type="CAUSAL_LM",
    )
    # On the meta device when the base is (`framer-ds plan`): peft's copies of the embedding and head
    # (modules_to_save) would otherwise be allocated and initialised for real, ~1 GB for a 129k vocabulary.
    try:
        with torch.device("meta") if building_empty() else contextlib.nullcontext():
            return get_peft_model(model, peft_config)
    except ValueError as exc:  # peft: target modules not found
        raise ConfigError([ConfigProblem("model.lora.target_modules", str(exc))], "model") from None


def merge_adapter_in_place(config, assets: TtsAssets, out_dir: Path) -> None:
    """Replace the adapter saved in `out_dir` by the base with it merged (rank 0, on CPU)."""
    from peft import PeftModel

    base = resized_base(config, assets)
    merged = PeftModel.from_pretrained(base, out_dir).merge_and_unload()
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        (out_dir / name).unlink()
    merged.save_pretrained(out_dir, safe_serialization=True)
