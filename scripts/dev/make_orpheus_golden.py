"""Writes `tests/golden/orpheus/sequences.json`: the SNAC codes Orpheus's own decoder takes from generated
token sequences, for the comparison with `framer_ds.tasks.tts_lm.audio_tokens.deinterleave` (what `framer-ds
sample` decodes) in tests/test_orpheus_parity.py.

Upstream: canopyai/Orpheus-TTS at 835ac7cd1870fa1fa5e342e14260c2d68cabb2e7, file
`orpheus_tts_pypi/orpheus_tts/decoder.py` (the `orpheus_tts` package's decoder, used by its vLLM engine):
`turn_token_into_id` maps each streamed piece `<custom_token_N>` to `N - 10 - (index % 7) * 4096`,
`tokens_decoder` keeps the ids > 0 (advancing the slot index only for those) and, every 7 kept ids once
more than 27 are kept, hands the last 28 (4 frames) to `convert_to_audio`, which de-interleaves whole
frames (c0 <- slot 0; c1 <- slots 1, 4; c2 <- slots 2, 3, 5, 6) and refuses the window (returns None)
when a code is < 0 or > 4096. Get the file with

    git --git-dir=/work/.mirror/canopyai+Orpheus-TTS/repo show \\
        835ac7cd1870fa1fa5e342e14260c2d68cabb2e7:orpheus_tts_pypi/orpheus_tts/decoder.py > /tmp/decoder.py
    python scripts/dev/make_orpheus_golden.py --decoder /tmp/decoder.py

Patches at run time, none to the file: its module-level `SNAC.from_pretrained(...)` (a download) gets a
stand-in whose `decode(codes)` records the three code tensors it is given and returns silence: the codes
ARE Orpheus's answer, the audio is SNAC's business. Everything else is Orpheus's code as it runs:
`tokens_decoder_sync` is fed each sequence as the strings vLLM streams (`<custom_token_{id - 128256}>`
for the Llama-3 tokenizer's added tokens, plain text for a text token) and records every window it
decodes; the ids it kept are read back from those windows, and `convert_to_audio` on all of them gives
Orpheus's codes for the whole sequence (None: Orpheus refuses it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import types
from pathlib import Path

import torch

from framer_ds.tasks.tts_lm.audio_tokens import AudioTokenLayout, interleave

OUT = Path(__file__).resolve().parents[2] / "tests" / "golden" / "orpheus" / "sequences.json"
UPSTREAM = {"repo": "canopyai/Orpheus-TTS", "commit": "835ac7cd1870fa1fa5e342e14260c2d68cabb2e7"}
TOKENIZER_LENGTH = 128256  # Llama-3: <custom_token_0> is id 128256 (vocabulary.PRESETS["llama3"])
LAYOUT = AudioTokenLayout(audio_start=TOKENIZER_LENGTH + 10, codebook_size=4096)
TEXT_TOKEN = 1734  # a Llama-3 text id; Orpheus sees its text piece, which holds no custom token
START_OF_SPEECH = TOKENIZER_LENGTH + 1  # a marker inside the speech


class RecordingSnac:
    """Stands in for the SNAC model: records the codes `convert_to_audio` decodes."""

    def __init__(self):
        self.decoded: list[list[list[int]]] = []

    def eval(self):
        return self

    def to(self, device):
        return self

    def decode(self, codes):
        self.decoded.append([c[0].tolist() for c in codes])
        return torch.zeros(1, 1, 4096)


def load_decoder(path: Path):
    snac = RecordingSnac()
    sys.modules["snac"] = types.SimpleNamespace(
        SNAC=types.SimpleNamespace(from_pretrained=lambda *a, **k: snac)
    )
    spec = importlib.util.spec_from_file_location("orpheus_decoder", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, snac


def orpheus_strings(ids: list[int]) -> list[str]:
    return [f"<custom_token_{i - TOKENIZER_LENGTH}>" if i >= TOKENIZER_LENGTH else " the" for i in ids]


def run_orpheus(decoder, snac: RecordingSnac, ids: list[int]) -> dict:
    """Orpheus's streaming decode of `ids` (every window), and its convert_to_audio on all kept ids."""
    original = decoder.convert_to_audio
    windows: list[dict] = []

    def recording(multiframe, count):
        before = len(snac.decoded)
        result = original(multiframe, count)
        codes = snac.decoded[-1] if len(snac.decoded) > before else None
        windows.append({"count": count, "ids": list(multiframe), "codes": codes})
        return result

    decoder.convert_to_audio = recording
    try:
        list(decoder.tokens_decoder_sync(iter(orpheus_strings(ids))))
    finally:
        decoder.convert_to_audio = original
    kept = list(windows[0]["ids"]) if windows else []
    for window in windows[1:]:
        assert window["ids"][:21] == kept[-21:], "windows overlap by 3 frames"
        kept += window["ids"][21:]
    before = len(snac.decoded)
    whole = original(kept, len(kept))
    return {
        "orpheus_kept_ids": kept,
        "orpheus_codes": snac.decoded[-1] if whole is not None and len(snac.decoded) > before else None,
        "orpheus_windows": [{"count": w["count"], "codes": w["codes"]} for w in windows],
    }


def random_codes(frames: int, rng: random.Random) -> list[list[int]]:
    """Codes 1..4095: Orpheus drops a code 0 (its `token > 0`), a case of its own below."""
    return [[rng.randrange(1, 4096) for _ in range(frames * n)] for n in (1, 2, 4)]


def cases() -> list[dict]:
    rng = random.Random(31)
    clean = random_codes(6, rng)
    tokens = interleave(clean, LAYOUT)
    zero = random_codes(6, rng)
    zero[2][2 * 4 + 1] = 0  # frame 2, slot 3 (c2[4i + 1])
    zero[0][4] = 0  # frame 4, slot 0
    long = random_codes(8, rng)
    long_tokens = interleave(long, LAYOUT)
    wrong_slot = list(long_tokens)
    wrong_slot[2 * 7 + 2] = LAYOUT.slot_range(5)[123]  # frame 2, slot 2 holds a slot-5 id
    code_4096 = list(long_tokens)
    code_4096[3 * 7 + 1] = LAYOUT.slot_range(2)[0]  # frame 3, slot 1: Orpheus reads code 4096
    inserted = [*tokens[:10], TEXT_TOKEN, *tokens[10:30], START_OF_SPEECH, *tokens[30:]]
    return [
        {"name": "clean", "codes": clean, "token_ids": tokens},
        {"name": "trailing_partial_frame", "codes": clean, "token_ids": tokens + tokens[:3]},
        {"name": "non_audio_tokens_inserted", "codes": clean, "token_ids": inserted},
        {"name": "code_zero", "codes": zero, "token_ids": interleave(zero, LAYOUT)},
        {"name": "wrong_slot_range", "codes": long, "token_ids": wrong_slot},
        {"name": "code_4096", "codes": long, "token_ids": code_4096},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--decoder", type=Path, required=True, help="Orpheus's decoder.py (see the docstring)"
    )
    args = parser.parse_args()
    decoder, snac = load_decoder(args.decoder)
    sequences = []
    for case in cases():
        case.update(run_orpheus(decoder, snac, case["token_ids"]))
        decoded = case["orpheus_codes"]
        print(
            f"{case['name']}: {len(case['token_ids'])} tokens, Orpheus: {decoded and len(decoded[0])} frames"
        )
        sequences.append(case)
    record = {
        "upstream": UPSTREAM,
        "audio_start": LAYOUT.audio_start,
        "codebook_size": LAYOUT.codebook_size,
        "sequences": sequences,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
