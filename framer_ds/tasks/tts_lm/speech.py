"""Text -> generated audio tokens -> SNAC codes -> a .wav, for the samples written while training and
for `framer-ds sample`. A generation that breaks the layout is decoded up to the fault and reported
(`deinterleave`), never crashed on or decoded into noise."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from framer_ds.data.audio_tokens import SLOTS_PER_FRAME, AudioTokenLayout, deinterleave
from framer_ds.data.snac_codec import decode, write_wav
from framer_ds.data.token_sequences import SpecialTokens
from framer_ds.engine.rng import isolated_seed


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
    """A transformers logits processor that keeps generation inside the layout: the n-th generated token
    may only be a code of slot n % 7, and a frame may end the speech. An untrained or young model then
    still yields decodable audio, so early samples show what it learned rather than a format error."""

    def __init__(self, prompt_length: int, layout: AudioTokenLayout, stops: list[int], vocab_size: int):
        self.prompt_length = prompt_length
        self.allowed = torch.zeros(SLOTS_PER_FRAME, vocab_size, dtype=torch.bool)
        for slot in range(SLOTS_PER_FRAME):
            codes = layout.slot_range(slot)
            self.allowed[slot, codes.start : codes.stop] = True
        self.allowed[0, stops] = True

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        slot = (input_ids.shape[1] - self.prompt_length) % SLOTS_PER_FRAME
        allowed = self.allowed[slot, : scores.shape[-1]].to(scores.device)
        return scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)


@torch.no_grad()
def generate_audio_tokens(
    model,
    prompt_ids: list[int],
    special: SpecialTokens,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    repetition_penalty: float,
    seed: int,
    constrain_slots: bool,
    synced_gpus: bool = False,
) -> list[int]:
    """The tokens generated after the prompt, up to (not including) end_of_speech."""
    from transformers import LogitsProcessorList

    device = next(model.parameters()).device
    input_ids = torch.tensor([prompt_ids], device=device)
    sampling = temperature > 0
    stops = [special.end_of_speech, special.end_of_ai]
    processors = LogitsProcessorList()
    if constrain_slots:
        layout = AudioTokenLayout(special.audio_start)
        vocab = model.get_output_embeddings().out_features
        processors.append(AudioSlotConstraint(len(prompt_ids), layout, stops, vocab))
    with isolated_seed(seed):
        output = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=sampling,
            temperature=temperature if sampling else None,
            top_p=top_p if sampling else None,
            top_k=None,
            repetition_penalty=repetition_penalty,
            eos_token_id=stops,
            pad_token_id=special.pad,
            logits_processor=processors,
            synced_gpus=synced_gpus,
        )
    generated = output[0, len(prompt_ids) :].tolist()
    for stop in (special.end_of_speech, special.end_of_ai, special.pad):
        if stop in generated:
            generated = generated[: generated.index(stop)]
    return generated


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
