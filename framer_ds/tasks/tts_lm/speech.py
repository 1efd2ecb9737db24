"""Text -> generated audio tokens -> SNAC codes -> a .wav, for the samples written while training and
for `framer-ds sample`. A generation that breaks the layout is decoded up to the fault and reported
(`deinterleave`), never crashed on or decoded into noise."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from framer_ds.data.progress import sampling_progress
from framer_ds.engine.rng import isolated_seed
from framer_ds.tasks.tts_lm.audio_tokens import SLOTS_PER_FRAME, AudioTokenLayout, deinterleave
from framer_ds.tasks.tts_lm.snac_codec import decode, write_wav
from framer_ds.tasks.tts_lm.token_sequences import SpecialTokens


@dataclass
class Speech:
    tokens: list[int]  # what the model generated after start_of_speech
    frames: int = 0
    problems: list[str] = field(default_factory=list)
    path: Path | None = None

    def describe(self) -> str:
        where = str(self.path) if self.path is not None else "nothing written"
        text = f"{where}: {self.frames} frames ({len(self.tokens)} tokens)"
        return text + ("; " + "; ".join(self.problems) if self.problems else "")


class AudioSlotConstraint:
    """Keeps generation inside the layout (transformers' `prefix_allowed_tokens_fn`, which runs before
    temperature and top-p, so those only ever choose among allowed tokens): the n-th generated token may
    only be a code of slot n % 7, and a frame boundary may end the speech. An untrained or young model
    then still yields decodable audio, so early samples show what it learned, not a format error."""

    def __init__(self, prompt_length: int, layout: AudioTokenLayout, stops: list[int]):
        self.prompt_length = prompt_length
        self.allowed = [list(layout.slot_range(slot)) for slot in range(SLOTS_PER_FRAME)]
        self.allowed[0] = self.allowed[0] + list(stops)

    def __call__(self, batch_id: int, input_ids: torch.Tensor) -> list[int]:
        return self.allowed[(input_ids.shape[-1] - self.prompt_length) % SLOTS_PER_FRAME]


class TokenProgress:
    """A streamer for `generate` that counts generated tokens on a progress bar (transformers calls
    `put` with the prompt first, then with each new token, and `end` once)."""

    def __init__(self, bar):
        self.bar, self.prompt_seen = bar, False

    def put(self, value: torch.Tensor) -> None:
        if self.prompt_seen:
            self.bar.update(value.numel())
        self.prompt_seen = True

    def end(self) -> None:
        self.bar.close()


def generate_audio_tokens(model, prompt_ids: list[int], special: SpecialTokens, **options) -> list[int]:
    """The tokens generated after the prompt, up to (not including) end_of_speech; `options` are
    `generate_tokens`'s."""
    return until_stop(generate_tokens(model, prompt_ids, special, **options), special)


def until_stop(generated: list[int], special: SpecialTokens) -> list[int]:
    """`generated` cut before its first stop (end_of_speech, end_of_ai or padding)."""
    for stop in (special.end_of_speech, special.end_of_ai, special.pad):
        if stop in generated:
            generated = generated[: generated.index(stop)]
    return generated


@torch.no_grad()
def generate_tokens(
    model,
    prompt_ids: list[int],
    special: SpecialTokens,
    *,
    max_new_tokens: int,
    min_new_tokens: int,
    temperature: float,
    top_p: float,
    repetition_penalty: float,
    seed: int,
    constrain_slots: bool,
    synced_gpus: bool = False,
    show_progress: bool = False,
) -> list[int]:
    """Every token generated after the prompt, the stop included (the quality gates count how often
    speech ends before max_new_tokens). `show_progress`: a bar of generated tokens on a terminal
    (`data.progress.sampling_progress`)."""
    device = next(model.parameters()).device
    input_ids = torch.tensor([prompt_ids], device=device)
    sampling = temperature > 0
    stops = [special.end_of_speech, special.end_of_ai]
    constraint = AudioSlotConstraint(len(prompt_ids), AudioTokenLayout(special.audio_start), stops)
    bar = sampling_progress(max_new_tokens, "speak", show_progress)
    with isolated_seed(seed), bar:
        output = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=min(min_new_tokens, max_new_tokens),
            do_sample=sampling,
            temperature=temperature if sampling else None,
            top_p=top_p if sampling else None,
            top_k=None,
            repetition_penalty=repetition_penalty,
            eos_token_id=stops,
            pad_token_id=special.pad,
            prefix_allowed_tokens_fn=constraint if constrain_slots else None,
            synced_gpus=synced_gpus,
            streamer=None if bar.disable else TokenProgress(bar),  # no per-token copy when hidden
        )
    return output[0, len(prompt_ids) :].tolist()


def speech_to_wav(tokens: list[int], layout: AudioTokenLayout, codec, path: Path) -> Speech:
    """Decode the well-formed frames of `tokens` to `path`; a generation with none writes nothing."""
    speech = Speech(tokens)
    unpacked = deinterleave(tokens, layout)
    speech.problems = unpacked.problems
    speech.frames = len(unpacked.codes[0])
    if speech.frames == 0:
        speech.problems.append("no complete audio frame was generated; train longer or check the prompt")
        return speech
    speech.path = write_wav(path, decode(codec, unpacked.codes), codec.sampling_rate)
    return speech
