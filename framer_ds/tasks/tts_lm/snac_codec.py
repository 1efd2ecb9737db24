"""The SNAC 24 kHz codec: audio files -> three code lists, and code lists -> a waveform.

`snac` does the coding; this module reads and resamples audio (soundfile + scipy's polyphase
resampler), batches it, trims each item's codes to its own length, and names the file that cannot be
read. A tiny random codec with the real structure (3 codebooks at 1x/2x/4x, 4096 codes) is built from a
config for tests and the CPU demo, and loads through `SNAC.from_pretrained(DIR)` like the real one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from framer_ds.compat import require

# SNAC 24 kHz's structure (hubertsiuzdak/snac_24khz config.json) at a fraction of its width.
TINY_SNAC_CONFIG = {
    "sampling_rate": 24000,
    "encoder_dim": 8,
    "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 32,
    "decoder_rates": [8, 8, 4, 2],
    "attn_window_size": None,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [4, 2, 1],
    "noise": True,
    "depthwise": True,
}


class AudioReadError(ValueError):
    """An audio file that cannot be used; the message names it and the fix."""


def create_tiny_codec(directory: Path, seed: int = 0) -> Path:
    """A random SNAC saved as `config.json` + `pytorch_model.bin` (the Hub layout)."""
    SNAC = require("snac", "the SNAC audio codec (tts_lm)").SNAC

    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    codec = SNAC(**TINY_SNAC_CONFIG)
    (directory / "config.json").write_text(json.dumps(TINY_SNAC_CONFIG, indent=2))
    torch.save(codec.state_dict(), directory / "pytorch_model.bin")
    return directory


def load_codec(directory: Path, device: str = "cpu"):
    SNAC = require("snac", "the SNAC audio codec (tts_lm)").SNAC
    directory = Path(directory)
    missing = [n for n in ("config.json", "pytorch_model.bin") if not (directory / n).is_file()]
    if missing:
        raise AudioReadError(
            f"{directory} is not a SNAC directory (missing {', '.join(missing)}); download it once with "
            "`huggingface-cli download hubertsiuzdak/snac_24khz --local-dir DIR` and set model.codec.path"
        )
    codec = SNAC.from_pretrained(str(directory)).eval().to(device)
    if len(codec.vq_strides) != 3:
        raise AudioReadError(
            f"{directory}: a SNAC with {len(codec.vq_strides)} codebooks; the TTS layout needs the 24 kHz "
            "model's 3 (hubertsiuzdak/snac_24khz)"
        )
    return codec


def samples_per_frame(codec) -> int:
    """Audio samples per coarse frame (7 LM tokens): hop x the coarsest stride (2048 at 24 kHz)."""
    return int(codec.hop_length) * int(codec.vq_strides[0])


def read_audio(source: Path | BinaryIO, sample_rate: int, name: str | None = None) -> np.ndarray:
    """Mono float32 at `sample_rate`, whatever the file's rate and channels. `source`: a file, or the
    bytes of one (a data set's Audio column); `name` is what an error calls it (default the path)."""
    from scipy.signal import resample_poly

    soundfile = require("soundfile", "reading audio files (tts_lm data.format audio)")
    name = name or str(source)
    if isinstance(source, Path | str) and not Path(source).is_file():  # soundfile says "System error."
        raise AudioReadError(f"{name}: no such file; add it, or drop the row that names it")
    try:
        audio, rate = soundfile.read(
            str(source) if isinstance(source, Path | str) else source, dtype="float32", always_2d=True
        )
    except Exception as exc:  # soundfile raises LibsndfileError / RuntimeError / OSError
        raise AudioReadError(f"{name}: cannot read audio ({exc}); convert it to wav or flac") from None
    audio = audio.mean(axis=1)
    if audio.size == 0:
        raise AudioReadError(f"{name}: no samples; drop the row or replace the file")
    if not np.isfinite(audio).all():
        raise AudioReadError(f"{name}: holds NaN or infinite samples; re-export the file")
    if rate != sample_rate:
        ratio = Fraction(sample_rate, rate)
        audio = resample_poly(audio, ratio.numerator, ratio.denominator).astype(np.float32)
    return audio


@torch.no_grad()
def encode_batch(codec, waveforms: Sequence[np.ndarray]) -> list[list[list[int]]]:
    """Three code lists per waveform. The batch is zero-padded to its longest item; each item keeps the
    frames its own samples cover."""
    device = next(codec.parameters()).device
    longest = max(len(w) for w in waveforms)
    batch = torch.zeros(len(waveforms), 1, longest)
    for row, wave in enumerate(waveforms):
        batch[row, 0, : len(wave)] = torch.from_numpy(np.asarray(wave, dtype=np.float32))
    codes = codec.encode(batch.to(device))
    per_frame = samples_per_frame(codec)
    strides = [codec.vq_strides[0] // s for s in codec.vq_strides]  # codes per coarse frame: 1, 2, 4
    result = []
    for row, wave in enumerate(waveforms):
        frames = max(1, math.ceil(len(wave) / per_frame))
        result.append([codes[book][row, : frames * n].tolist() for book, n in enumerate(strides)])
    return result


@torch.no_grad()
def decode(codec, codes: Sequence[Sequence[int]]) -> np.ndarray:
    """One waveform (float32, the codec's rate) from three code lists."""
    device = next(codec.parameters()).device
    tensors = [torch.tensor([list(c)], dtype=torch.long, device=device) for c in codes]
    return codec.decode(tensors)[0, 0].float().cpu().numpy()


def write_wav(path: Path, audio: np.ndarray, sample_rate: int) -> Path:
    soundfile = require("soundfile", "writing .wav samples (tts_lm)")

    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(str(path), np.clip(audio, -1.0, 1.0), sample_rate, subtype="PCM_16")
    return path
