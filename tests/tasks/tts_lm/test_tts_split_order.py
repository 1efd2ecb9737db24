"""`data.length_policy: split` cuts long utterances at SNAC frame boundaries into prompt + audio
continuation pieces and drops no token; `data.shuffle: false` trains in the file order."""

from __future__ import annotations

import pytest
from test_tts_lm import load_task, write_config

from framer_ds.tasks.tts_lm.splitting import split_sequence
from framer_ds.tasks.tts_lm.token_sequences import IGNORE_INDEX, SpecialTokens, build_sequence

SPECIAL = SpecialTokens.relative_to(320, 0, 1)


def learned(labels: list[int]) -> list[int]:
    return [label for label in labels if label != IGNORE_INDEX]


@pytest.mark.parametrize("loss_on", ["all", "audio"])
def test_a_split_utterance_learns_every_token_once_in_frame_aligned_pieces(loss_on):
    text = list(range(2, 12))
    audio = [SPECIAL.audio_start + i for i in range(7 * 40)]  # 40 frames
    whole = build_sequence(text, audio, SPECIAL, loss_on)
    prompt = whole.input_ids[: whole.input_ids.index(SPECIAL.start_of_speech) + 1]
    pieces = split_sequence(whole, 100, SPECIAL.start_of_speech, SPECIAL.end_of_speech)

    assert len(pieces) > 2 and all(len(p) <= 100 for p in pieces)
    assert all(p.input_ids[: len(prompt)] == prompt for p in pieces)  # every piece says what is spoken
    for piece in pieces[:-1]:
        assert (len(piece) - len(prompt)) % 7 == 0  # whole frames, no end markers yet
    assert pieces[-1].input_ids[-2:] == [SPECIAL.end_of_speech, SPECIAL.end_of_ai]
    assert learned(pieces[0].labels)[: len(learned(whole.labels[: len(prompt)]))] == learned(
        whole.labels[: len(prompt)]
    )
    # the frames before a continuation's own are context: in its input, not in its labels
    assert pieces[1].input_ids[len(prompt)] < pieces[1].labels[-1]
    assert pieces[1].labels[len(prompt)] == IGNORE_INDEX
    # every learned token of the utterance, once and in order
    assert [t for p in pieces for t in learned(p.labels)] == learned(whole.labels)


def test_split_policy_drops_no_token_where_filter_drops_the_long_ones(tmp_path, tiny_tts):
    def train_items(policy: str):
        config = write_config(
            tmp_path / f"{policy}.yaml", tmp_path / policy, source={"builtin": "tiny_speech"},
            max_seq_length=96, length_policy=policy, val_fraction=0.0,
        )  # fmt: skip
        task = load_task(config)
        train, _ = task.build_datasets()
        return [train[i] for i in range(len(train))], task

    whole = load_task_sequences(tmp_path, tiny_tts)
    long = [s for s in whole if len(s) > 96]
    assert long, "the tiny data must hold utterances over the limit for this test to mean anything"
    split, task = train_items("split")
    assert task.data_summary()["length statistics"]["dropped_tokens"] == 0
    assert all(len(s) <= 96 for s in split)
    assert sum(len(learned(s.labels)) for s in split) == sum(len(learned(s.labels)) for s in whole)
    filtered, _ = train_items("filter")
    assert sum(len(learned(s.labels)) for s in filtered) < sum(len(learned(s.labels)) for s in whole)


def load_task_sequences(tmp_path, tiny_tts):
    config = write_config(
        tmp_path / "all.yaml", tmp_path / "all", source={"builtin": "tiny_speech"}, val_fraction=0.0
    )
    return load_task(config).data.build_sequences().train


def test_shuffle_false_trains_in_the_file_order(tmp_path, tiny_tts):
    from framer_ds.train.run import training_loaders

    def first_rows(**data) -> list[list[int]]:
        config = write_config(
            tmp_path / "c.yaml", tmp_path / "run", source={"builtin": "tiny_speech"}, **data
        )
        task = load_task(config)
        train, _ = task.build_datasets()
        loader, _ = training_loaders(task, task.config.train, train, None)
        rows = [
            row[mask.bool()].tolist()
            for b in loader
            for row, mask in zip(b["input_ids"], b["attention_mask"], strict=True)
        ]
        return rows[:8], [train[i].input_ids for i in range(8)], task

    rows, in_file_order, task = first_rows(shuffle=False, val_fraction=0.0)
    assert rows == in_file_order
    assert [s.input_ids for s in task.data.build_sequences().train[:8]] == in_file_order
    shuffled, _, _ = first_rows()
    assert shuffled != in_file_order  # the default order is not the file's: the check can fail


def test_shuffle_false_with_length_grouping_asked_is_refused(tmp_path, tiny_tts):
    from framer_ds.config.errors import ConfigError

    config = write_config(
        tmp_path / "c.yaml", tmp_path / "run", source={"builtin": "tiny_speech"}, shuffle=False,
        group_by_length=True,
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"set data\.group_by_length false"):
        load_task(config)
