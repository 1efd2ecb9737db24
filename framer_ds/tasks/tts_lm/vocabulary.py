"""The tokenizer extended with the recipe's markers and audio codes, and the check that a preset's ids
are the tokenizer's.

The recipe appends `<custom_token_0>` ... `<custom_token_{7*4096+9}>` right after the base vocabulary:
markers at +1..+7, audio codes from +10 (`SpecialTokens.relative_to`). A tokenizer that already holds
them (a checkpoint trained with the recipe, e.g. Orpheus) is used as it is; its offsets are checked, so
a layout that silently disagrees with the checkpoint fails before training.
"""

from __future__ import annotations

from dataclasses import dataclass

from framer_ds.config.errors import ConfigProblem
from framer_ds.tasks.tts_lm.audio_tokens import SLOTS_PER_FRAME, AudioTokenLayout
from framer_ds.tasks.tts_lm.config import SpecialTokenOptions
from framer_ds.tasks.tts_lm.token_sequences import SpecialTokens

CODEBOOK_SIZE = 4096  # SNAC 24 kHz
ADDED_TOKENS = SLOTS_PER_FRAME * CODEBOOK_SIZE + 10
KEY = "model.special_tokens"


@dataclass(frozen=True)
class Preset:
    tokenizer_length: int
    start_of_text: int | None
    end_of_text: int


# The values the recipe's configs use for these bases (Orpheus = Llama-3; VyvoTTS LFM2 / Granite).
PRESETS = {
    "llama3": Preset(128256, 128000, 128009),
    "lfm2": Preset(64400, 1, 2),
    "granite": Preset(49155, None, 0),
}


def custom_token(index: int) -> str:
    return f"<custom_token_{index}>"


def base_length(tokenizer) -> int:
    """The vocabulary before the recipe's tokens: where `<custom_token_0>` sits, or the whole length."""
    first = tokenizer.convert_tokens_to_ids(custom_token(0))
    unknown = tokenizer.unk_token_id
    if isinstance(first, int) and first != unknown and first is not None:
        return first
    return len(tokenizer)


def wanted_layout(options: SpecialTokenOptions, tokenizer) -> Preset:
    return stand_in_layout(options, base_length(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id)


def stand_in_layout(
    options: SpecialTokenOptions, vocab_size: int, bos: int | None, eos: int | None
) -> Preset:
    """The layout `options` ask for, given the base vocabulary's size, BOS and EOS ('auto' takes them):
    from the tokenizer (`wanted_layout`), or from the model's config.json alone (`framer-ds plan` before
    the download, when no tokenizer is on disk)."""
    if options.preset == "auto":
        return Preset(vocab_size, bos, eos if eos is not None else 0)
    if options.preset == "custom":
        return Preset(options.tokenizer_length, options.start_of_text, options.end_of_text)
    return PRESETS[options.preset]


def layout_problems(options: SpecialTokenOptions, tokenizer) -> list[ConfigProblem]:
    """Why the preset does not fit this tokenizer (empty when it does)."""
    preset = wanted_layout(options, tokenizer)
    problems = []
    actual = base_length(tokenizer)
    if preset.tokenizer_length != actual:
        problems.append(
            ConfigProblem(
                KEY,
                f"preset {options.preset!r} puts the new tokens after {preset.tokenizer_length} base ids, "
                f"but this tokenizer's base vocabulary has {actual}. Use the tokenizer the preset was made "
                "for, preset 'auto' (a new layout from this tokenizer), or 'custom' with tokenizer_length: "
                f"{actual}",
            )
        )
    for name in ("start_of_text", "end_of_text"):
        token_id = getattr(preset, name)
        if token_id is None:
            continue
        if not 0 <= token_id < actual:
            problems.append(
                ConfigProblem(KEY, f"{name} {token_id} is outside the base vocabulary 0..{actual - 1}")
            )
        elif options.preset in PRESETS and token_id not in tokenizer.all_special_ids:
            # A named preset was made for one base: a plain word at its id means another base. 'custom'
            # ids are the user's own (data tokenized with `<|eot_id|>` as plain text, say): taken as given.
            token = tokenizer.convert_ids_to_tokens(token_id)
            problems.append(
                ConfigProblem(
                    KEY,
                    f"{name} {token_id} is {token!r} in this tokenizer, not one of its special tokens "
                    f"({sorted(tokenizer.all_special_tokens)[:8]}...): the preset was made for another "
                    "base; use preset 'auto', or 'custom' with this tokenizer's ids",
                )
            )
    return problems


def extend_tokenizer(tokenizer) -> int:
    """Add the recipe's tokens where they are missing and check they form one contiguous block after the
    base vocabulary; returns how many were added."""
    start = base_length(tokenizer)
    have = start != len(tokenizer)
    added = 0
    if not have:
        added = tokenizer.add_tokens([custom_token(i) for i in range(ADDED_TOKENS)])
    last = tokenizer.convert_tokens_to_ids(custom_token(ADDED_TOKENS - 1))
    if last != start + ADDED_TOKENS - 1:
        raise ValueError(
            f"the tokenizer's {custom_token(0)}..{custom_token(ADDED_TOKENS - 1)} are not one block at "
            f"{start}..{start + ADDED_TOKENS - 1} ({custom_token(ADDED_TOKENS - 1)} is {last}); start from "
            "the base tokenizer without the recipe's tokens"
        )
    return added


def special_tokens(options: SpecialTokenOptions, tokenizer) -> SpecialTokens:
    preset = wanted_layout(options, tokenizer)
    return SpecialTokens.relative_to(preset.tokenizer_length, preset.start_of_text, preset.end_of_text)


def audio_layout(special: SpecialTokens) -> AudioTokenLayout:
    return AudioTokenLayout(special.audio_start, CODEBOOK_SIZE)
