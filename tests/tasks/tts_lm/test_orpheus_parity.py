"""The SNAC codes `framer-ds sample` takes from a generated token sequence (`deinterleave`) against those
Orpheus's own decoder takes (golden data: tests/golden/orpheus/sequences.json, made by
scripts/dev/make_orpheus_golden.py running canopyai/Orpheus-TTS's `orpheus_tts/decoder.py`).

Codes are integers: equal means equal. Where the two differ, it is on purpose and asserted as such:
- a valid code 0: Orpheus drops it (`if token > 0`), which shifts every later slot; we keep it;
- an audio token in another slot's range: Orpheus refuses every 4-frame window holding it (no audio;
  its stream resumes after it, splicing across the gap unannounced); we decode up to that frame and say
  where it broke;
- code 4096 (the id of the next slot's code 0): Orpheus's check is `> 4096`, so it passes 4096 to SNAC,
  whose codebooks hold 0..4095; we stop there.
"""

from __future__ import annotations

import json

import pytest

from conftest import REPO
from framer_ds.tasks.tts_lm.audio_tokens import AudioTokenLayout, deinterleave

GOLDEN = json.loads((REPO / "tests" / "golden" / "orpheus" / "sequences.json").read_text())
LAYOUT = AudioTokenLayout(GOLDEN["audio_start"], GOLDEN["codebook_size"])
CASES = {case["name"]: case for case in GOLDEN["sequences"]}


def frames(codes: list[list[int]], first: int, last: int) -> list[list[int]]:
    """Frames [first, last) of three code lists."""
    return [book[first * n : last * n] for book, n in zip(codes, (1, 2, 4), strict=True)]


def accepted_windows(case: dict):
    """(first frame, codes) of each 4-frame window Orpheus's stream decoded."""
    for window in case["orpheus_windows"]:
        if window["codes"] is not None:
            yield window["count"] // 7 - 4, window["codes"]


def test_the_layout_is_orpheus():
    assert LAYOUT.audio_start == 128256 + 10 and LAYOUT.codebook_size == 4096


@pytest.mark.parametrize("name", ["clean", "trailing_partial_frame", "non_audio_tokens_inserted"])
def test_our_codes_are_orpheus_codes(name):
    """Clean speech, a trailing partial frame (both drop it; we also say so) and non-audio tokens inside
    the speech (a text token, a marker: both skip them and go on with the next slot; we also say so)."""
    case = CASES[name]
    ours = deinterleave(case["token_ids"], LAYOUT)
    assert ours.codes == case["orpheus_codes"] == case["codes"]
    for first, codes in accepted_windows(case):
        assert frames(ours.codes, first, first + 4) == codes
    assert (ours.problems == []) == (name == "clean")


def test_a_code_zero_is_kept_where_orpheus_drops_it():
    case = CASES["code_zero"]
    ours = deinterleave(case["token_ids"], LAYOUT)
    assert ours.codes == case["codes"] and ours.problems == []
    assert case["orpheus_codes"] is None  # the dropped zero shifted every later slot out of range
    assert len(case["orpheus_kept_ids"]) < len(case["token_ids"])


def test_a_token_in_another_slots_range_stops_our_decode_at_its_frame():
    case = CASES["wrong_slot_range"]
    ours = deinterleave(case["token_ids"], LAYOUT)
    assert ours.codes == frames(case["codes"], 0, 2) and "frame 2, slot 2" in ours.problems[0]
    assert case["orpheus_codes"] is None
    starts = [first for first, _ in accepted_windows(case)]
    assert starts == [3, 4]  # Orpheus's stream skips every window holding frame 2, then resumes
    for first, codes in accepted_windows(case):
        assert codes == frames(case["codes"], first, first + 4)


def test_code_4096_is_refused_where_orpheus_passes_it_to_snac():
    case = CASES["code_4096"]
    ours = deinterleave(case["token_ids"], LAYOUT)
    assert ours.codes == frames(case["codes"], 0, 3) and "frame 3, slot 1" in ours.problems[0]
    assert 4096 in case["orpheus_codes"][1]  # outside SNAC's codebook (0..4095)
