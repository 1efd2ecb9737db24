"""The TTS token layer: SNAC codes <-> LM tokens, the sequence layout and labels, length policies with
their statistics, and packing that isolates samples (packed logits equal unpacked)."""

from __future__ import annotations

import random

import pytest
import torch

from framer_ds.tasks.tts_lm.audio_tokens import (
    AudioCodeError,
    AudioTokenLayout,
    deinterleave,
    interleave,
    remove_duplicate_frames,
)
from framer_ds.tasks.tts_lm.token_batches import collate_packed, collate_padded
from framer_ds.tasks.tts_lm.token_sequences import (
    IGNORE_INDEX,
    AllSamplesTooLong,
    SpecialTokens,
    TokenSequence,
    apply_length_policy,
    build_sequence,
    generation_prompt,
    length_grouped_order,
    pack,
)

LAYOUT = AudioTokenLayout(audio_start=1000, codebook_size=64)
SPECIAL = SpecialTokens.relative_to(tokenizer_length=990, start_of_text=1, end_of_text=2)


def random_codes(frames: int, size: int = 64, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(size) for _ in range(frames * n)] for n in (1, 2, 4)]


def test_interleave_is_the_recipes_layout_and_round_trips():
    codes = [[5], [6, 7], [8, 9, 10, 11]]
    tokens = interleave(codes, LAYOUT)
    # c0[0], c1[0], c2[0], c2[1], c1[1], c2[2], c2[3], slot k shifted by k * codebook_size
    assert tokens == [1000 + 5, 1064 + 6, 1128 + 8, 1192 + 9, 1256 + 7, 1320 + 10, 1384 + 11]
    many = random_codes(50)
    result = deinterleave(interleave(many, LAYOUT), LAYOUT)
    assert result.codes == many and result.problems == []


def test_malformed_generations_are_reported_and_decoded_up_to_the_fault():
    tokens = interleave(random_codes(3), LAYOUT)
    swapped = [*tokens[:7], tokens[8], tokens[7], *tokens[9:]]  # slots 0 and 1 of frame 1 swapped
    result = deinterleave(swapped, LAYOUT)
    assert len(result.codes[0]) == 1 and "frame 1, slot 0" in result.problems[0]
    text_inside = deinterleave([5, *tokens[:7], 5, 6], LAYOUT)  # skipped, as Orpheus skips them
    assert text_inside.codes == deinterleave(tokens[:7], LAYOUT).codes
    assert "3 token(s) that are not audio skipped (the first, 5, at token 0)" in text_inside.problems[0]
    partial = deinterleave(tokens[:-3], LAYOUT)
    assert len(partial.codes[0]) == 2 and "trailing" in partial.problems[0]


@pytest.mark.parametrize(
    ("codes", "message"),
    [
        ([[1], [1, 2], [1, 2, 3]], "unequal length"),
        ([[], [], []], "no audio"),
        ([[1], [1, 2]], "2 code lists"),
        ([[1], [1, 99], [1, 2, 3, 4]], "code 99, outside 0..63"),
    ],
)
def test_bad_codes_name_the_sample_and_the_fix(codes, message):
    with pytest.raises(AudioCodeError, match=message) as info:
        interleave(codes, LAYOUT, sample="utterance 17")
    assert "utterance 17" in str(info.value)


def test_duplicate_frames_are_removed_by_their_coarse_code():
    codes = [[3, 3, 4], [1, 2, 3, 4, 5, 6], list(range(12))]
    assert remove_duplicate_frames(codes) == [[3, 4], [1, 2, 5, 6], [0, 1, 2, 3, 8, 9, 10, 11]]


def test_sequence_layout_and_audio_only_labels():
    audio = interleave(random_codes(2), LAYOUT)
    seq = build_sequence([1, 50, 51], audio, SPECIAL, loss_on="audio")
    prompt = [SPECIAL.start_of_human, 1, 50, 51, SPECIAL.end_of_text, SPECIAL.end_of_human]
    prompt += [SPECIAL.start_of_ai, SPECIAL.start_of_speech]
    assert seq.input_ids == prompt + audio + [SPECIAL.end_of_speech, SPECIAL.end_of_ai]
    assert seq.labels == [IGNORE_INDEX] * len(prompt) + audio + [SPECIAL.end_of_speech, SPECIAL.end_of_ai]
    assert (
        build_sequence([1], audio, SPECIAL, loss_on="all").labels
        == build_sequence([1], audio, SPECIAL).input_ids
    )
    assert generation_prompt([1, 50, 51], SPECIAL) == prompt
    assert (SPECIAL.pad, SPECIAL.audio_start) == (997, 1000)


def sequences(lengths: list[int]) -> list[TokenSequence]:
    return [TokenSequence(list(range(3, 3 + n)), list(range(3, 3 + n))) for n in lengths]


def test_filter_truncate_and_pack_report_what_they_did():
    data = sequences([10, 20, 30, 40, 100])
    kept, stats = apply_length_policy(data, 50, "filter", batch_size=2)
    assert [len(s) for s in kept] == [10, 20, 30, 40]
    assert (stats.dropped, stats.dropped_tokens, stats.min, stats.max, stats.median) == (
        1,
        100,
        10,
        100,
        30.0,
    )
    # grouped batches [10, 20] [30, 40]: 20 pad tokens of 120
    assert stats.padding_fraction == pytest.approx(20 / 120)
    cut, stats = apply_length_policy(data, 50, "truncate")
    assert [len(s) for s in cut] == [10, 20, 30, 40, 50] and (stats.truncated, stats.truncated_tokens) == (
        1,
        50,
    )
    blocks, stats = apply_length_policy(data, 50, "pack")
    assert sorted(len(b) for b in blocks) == [50, 50] and stats.dropped == 1  # 40+10, 30+20
    assert stats.padding_fraction == 0.0
    assert "dropped 1 (100 tokens)" in stats.describe() and stats.as_metrics()["data/kept"] == 4.0


def test_every_sample_too_long_fails_with_the_statistics():
    with pytest.raises(AllSamplesTooLong, match=r"min 60, median 70.*raise data.max_seq_length"):
        apply_length_policy(sequences([60, 70, 80]), 50, "filter")


def test_packing_keeps_samples_whole_and_apart():
    rng = random.Random(0)
    data = sequences([rng.randint(5, 60) for _ in range(200)])
    blocks = pack(data, 64)
    assert all(len(b) <= 64 for b in blocks)
    assert sum(len(b) for b in blocks) == sum(len(s) for s in data)
    assert 1 - sum(len(b) for b in blocks) / (64 * len(blocks)) < 0.05  # best-fit decreasing wastes little
    block = blocks[0]
    starts = [i for i, p in enumerate(block.position_ids) if p == 0]
    assert all(block.labels[i] == IGNORE_INDEX for i in starts)  # nothing predicts across samples
    assert pack(data, 64)[3].input_ids == blocks[3].input_ids  # deterministic on every rank


def test_length_grouped_order_is_a_deterministic_permutation_per_epoch():
    lengths = [random.Random(i).randint(1, 500) for i in range(1000)]
    first = length_grouped_order(lengths, 8, seed=1, epoch=0)
    assert sorted(first) == list(range(1000)) and first == length_grouped_order(lengths, 8, seed=1, epoch=0)
    assert first != length_grouped_order(lengths, 8, seed=1, epoch=1)
    padded = sum(max(lengths[i] for i in first[b : b + 8]) * 8 for b in range(0, 1000, 8))
    assert 1 - sum(lengths) / padded < 0.1  # random batches pad ~40%


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_packed_logits_equal_unpacked(attention):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation=attention,
    )
    model = LlamaForCausalLM(config).eval()
    rng = random.Random(1)
    data = [
        TokenSequence(ids, ids) for ids in ([rng.randrange(3, 128) for _ in range(n)] for n in (7, 12, 5))
    ]
    blocks = pack(data, 32)
    assert len(blocks) == 1
    # eager adds the mask to the scores: it needs the additive form; SDPA takes either
    batch = collate_packed(blocks, 32, pad_id=0, mask_dtype=torch.float32 if attention == "eager" else None)
    with torch.no_grad():
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0]
        offset = 0
        for index in sorted(range(3), key=lambda i: -len(data[i])):  # the order best-fit packed them
            alone = model(input_ids=torch.tensor([data[index].input_ids])).logits[0]
            n = len(data[index])
            torch.testing.assert_close(packed[offset : offset + n], alone, atol=1e-5, rtol=1e-5)
            offset += n
        # the loss sums match too: packed labels never reach across samples
        unpacked = sum(model(**collate_padded([s], 0)).loss * (len(s) - 1) for s in data)
        packed_loss = model(**batch).loss * sum(len(s) - 1 for s in data)
    torch.testing.assert_close(packed_loss, unpacked, atol=1e-4, rtol=1e-5)
