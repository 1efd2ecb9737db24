"""The quality gates find their held-out texts when the text starts and ends with the same token. Granite
4.0's tokenizer has BOS == EOS (id 100257; framer_ds/config/architectures/ibm-granite/granite-4.0-1b),
so with `special_tokens.preset: auto` a text is `<|end_of_text|> text <|end_of_text|>`; the gates looked
for the end from the start token itself, found an empty text, and `framer-ds eval` of the Granite
recipe printed "quality: skipped: no held-out sequence has both a text and a speech part" (found by
`framer-ds smoke configs/tasks/tts_lm/granite_1b_pretrain.yaml`, issue 47)."""

from __future__ import annotations

import json

from test_tts_lm import TINY, load_task

from framer_ds.tasks.tts_lm.quality import gates


def test_held_out_texts_are_found_when_the_start_and_end_of_text_are_one_token(tiny_tts):
    eos = load_task(TINY).assets.tokenizer.eos_token_id
    same = [
        "model.special_tokens.preset=custom",
        "model.special_tokens.tokenizer_length=320",
        f"model.special_tokens.start_of_text={eos}",
        f"model.special_tokens.end_of_text={eos}",
    ]
    task = load_task(TINY, "model.samples.every=0", *same)
    task.build_datasets()
    builder = task.data.builder()
    assert builder.special.start_of_text == builder.special.end_of_text == eos
    utterances = gates.held_out_utterances(task._held_out, builder, 3)
    rows = [json.loads(line) for line in (tiny_tts / "data" / "eval.jsonl").read_text().splitlines()[:3]]
    assert [u.text for u in utterances] == [row["text"] for row in rows]
