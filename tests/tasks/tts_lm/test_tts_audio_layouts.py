"""Speech corpora as published (LJSpeech, a folder of wav + txt pairs, a `datasets` directory with an
Audio column, a JSONL manifest) on real speech made here with espeak-ng (word tones without it): each
layout parses, a missing or empty one is one line from validate, `data encode-audio` resumes after a
kill with only the rest encoded and names a corrupt wav, and an LJSpeech folder trains; `sample` takes a
speaker (checked against the export's) and a zero-shot reference pair."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_tts_lm import framer_ds, load_task, write_config, write_jsonl

from conftest import read_metrics

ESPEAK = shutil.which("espeak-ng")

SENTENCES = [
    "hello world",
    "the quick brown fox",
    "jumps over the lazy dog",
    "this is a small demo",
    "of training text to audio",
    "with packing and length groups",
]
ESPEAK_RATE = 22050  # espeak-ng writes 22.05 kHz mono: the encoder resamples it to SNAC's 24 kHz


def speak(text: str, path: Path, voice: str = "en") -> Path:
    """`text` spoken by espeak-ng (Debian's package) into a 22.05 kHz wav; where it is not installed,
    the tiny set's word tones at that rate, so the tests run (and can fail) everywhere."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if ESPEAK is not None:
        subprocess.run([ESPEAK, "-v", voice, "-w", str(path), text], check=True, capture_output=True)
        return path
    import soundfile

    from framer_ds.tasks.tts_lm.tiny import spoken

    soundfile.write(str(path), spoken(text, ESPEAK_RATE), ESPEAK_RATE, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def ljspeech(tmp_path_factory) -> Path:
    """An LJSpeech folder: metadata.csv `id|text|normalized` + wavs/, six clips and a corrupt seventh."""
    root = tmp_path_factory.mktemp("LJSpeech-1.1")
    lines = []
    for index, text in enumerate(SENTENCES):
        speak(text, root / "wavs" / f"LJ001-{index:04d}.wav")
        lines.append(f"LJ001-{index:04d}|{text.capitalize()}.|{text}")
    (root / "wavs" / "LJ001-0099.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEnot audio at all")
    lines.append('LJ001-0099|A "quoted" line.|a quoted line')
    (root / "metadata.csv").write_text("\n".join(lines) + "\n")
    return root


def audio_config(tmp_path: Path, path: Path, layout: str, **data) -> Path:
    return write_config(
        tmp_path / f"{layout}.yaml",
        tmp_path / "run",
        source={"path": str(path)},
        format="audio",
        layout=layout,
        encoded_dir=str(tmp_path / "codes"),
        **data,
    )


# --- each layout parses ----------------------------------------------------------------------------


def test_each_layout_lists_its_clips_texts_and_speakers(tmp_path, ljspeech, tiny_tts):
    """LJSpeech takes the normalized text; a folder takes a.txt beside a.wav and the top subfolder as the
    speaker (a clip without its .txt is an error item, not a crash); a save_to_disk Audio column's bytes
    decode with soundfile (no torchcodec); a .jsonl.gz manifest resolves paths next to itself."""
    import datasets

    from framer_ds.tasks.tts_lm.audio_layouts import layout_items
    from framer_ds.tasks.tts_lm.snac_codec import read_audio

    columns = {"text": "text", "audio": "audio", "speaker": "speaker"}
    items = layout_items("ljspeech", ljspeech, columns)
    assert [i.text for i in items] == [*SENTENCES, "a quoted line"]
    assert items[0].path == ljspeech / "wavs" / "LJ001-0000.wav" and items[0].speaker is None

    folder = tmp_path / "folder"
    for speaker, voice in (("ana", "en"), ("ben", "en+m3")):
        for index, text in enumerate(SENTENCES[:2]):
            speak(text, folder / speaker / f"{index}.wav", voice)
            (folder / speaker / f"{index}.txt").write_text(text + "\n")
    speak("no transcript", folder / "ben" / "lonely.wav")
    items = layout_items("folder", folder, columns)
    assert [(i.speaker, i.text) for i in items if i.error is None] == [
        ("ana", "hello world"),
        ("ana", "the quick brown fox"),
        ("ben", "hello world"),
        ("ben", "the quick brown fox"),
    ]
    (lonely,) = [i for i in items if i.error is not None]
    assert "lonely.wav: no transcript lonely.txt" in lonely.error

    clips = [(ljspeech / "wavs" / f"LJ001-{i:04d}.wav").read_bytes() for i in range(2)]
    hf_dir = tmp_path / "hf"
    table = {"audio": [{"bytes": b, "path": None} for b in clips], "text": SENTENCES[:2], "who": ["a", "b"]}
    datasets.Dataset.from_dict(table).cast_column("audio", datasets.Audio()).save_to_disk(str(hf_dir))
    items = layout_items("hf", hf_dir, {**columns, "speaker": "who"})
    assert [(i.text, i.speaker) for i in items] == [(SENTENCES[0], "a"), (SENTENCES[1], "b")]
    wave = read_audio(io.BytesIO(items[0].data), 24000, items[0].key)
    seconds = len(read_audio(ljspeech / "wavs" / "LJ001-0000.wav", ESPEAK_RATE)) / ESPEAK_RATE
    assert abs(len(wave) / 24000 - seconds) < 1e-3  # resampled 22050 -> 24000, same duration

    manifest = tmp_path / "m" / "manifest.jsonl.gz"
    manifest.parent.mkdir()
    shutil.copy(ljspeech / "wavs" / "LJ001-0000.wav", manifest.parent / "a.wav")
    with gzip.open(manifest, "wt") as out:
        out.write(json.dumps({"text": "hello world", "audio": "a.wav", "speaker": "ana"}) + "\n")
    (item,) = layout_items("jsonl", manifest, columns)
    assert item.path == manifest.parent / "a.wav" and item.speaker == "ana"


def test_validate_names_a_missing_or_empty_layout_in_one_line(tmp_path, ljspeech, tiny_tts):
    empty = tmp_path / "empty"
    empty.mkdir()
    no_metadata = tmp_path / "no_metadata"
    (no_metadata / "wavs").mkdir(parents=True)
    cases = {
        ("ljspeech", no_metadata): "no_metadata: no metadata.csv; data.layout 'ljspeech' expects it",
        ("ljspeech", tmp_path / "absent"): "absent: no metadata.csv",
        ("folder", empty): "empty: no clips found in this 'folder' layout",
        ("hf", ljspeech): "not a datasets.save_to_disk one",
        ("jsonl", tmp_path / "absent.jsonl"): "absent.jsonl does not exist",
    }
    for (layout, path), expected in cases.items():
        config = audio_config(tmp_path, path, layout)
        proc = framer_ds("validate", config) if layout == "ljspeech" and path == no_metadata else None
        problems = [str(p) for p in load_task(config).check()]
        assert len(problems) == 1 and expected in problems[0], (layout, problems)
        if proc is not None:  # the command line shows it as one line, no traceback
            assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout
            assert expected in proc.stdout + proc.stderr


# --- encode once, resume after a kill, train -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ljspeech_encodes_resumes_after_a_kill_reports_the_corrupt_wav_and_trains(
    tmp_path, ljspeech, tiny_tts, monkeypatch
):
    from framer_ds.tasks.tts_lm import audio_encoding

    config = audio_config(
        tmp_path, ljspeech, "ljspeech", encode_batch_size=1, bad_samples="skip", val_fraction=0
    )
    real_encode, calls = audio_encoding.encode_batch, []

    def killed_after_three(codec, waves):
        if len(calls) == 3:
            raise KeyboardInterrupt  # the job killed while the fourth clip encodes
        calls.append(len(waves))
        return real_encode(codec, waves)

    monkeypatch.setattr(audio_encoding, "encode_batch", killed_after_three)
    with pytest.raises(KeyboardInterrupt):
        load_task(config).encode_data()
    (shard,) = (tmp_path / "codes").glob("*/shard_*.jsonl")
    assert len(shard.read_text().splitlines()) == 3 and not (shard.parent / "encoded.json").exists()
    with pytest.raises(Exception, match="not encoded yet: run `framer-ds data encode-audio CONFIG`"):
        load_task(config).data.build_sequences()  # a half encoded set is never trained on

    calls.clear()
    monkeypatch.setattr(
        audio_encoding, "encode_batch", lambda c, w: calls.append(len(w)) or real_encode(c, w)
    )
    report = load_task(config).encode_data()
    assert calls == [1, 1, 1]  # the three clips after the kill, and only those
    assert "6 encoded (3 this run), 1 failed" in report
    assert "LJ001-0099.wav: cannot read audio" in report
    entries = [json.loads(line) for line in shard.read_text().splitlines()]
    assert [e.get("text") for e in entries[:6]] == SENTENCES and "error" in entries[6]
    for entry, text in zip(entries, SENTENCES, strict=False):
        samples = len(
            audio_encoding.read_audio(ljspeech / "wavs" / f"LJ001-{SENTENCES.index(text):04d}.wav", 24000)
        )
        frames = int(np.ceil(samples / 2048))  # SNAC 24 kHz: 512 hop x 4 = 2048 samples a frame
        assert [len(c) for c in entry["codes"]] == [frames, 2 * frames, 4 * frames]

    again = framer_ds("data", "encode-audio", config)
    assert again.returncode == 0 and "(0 this run)" in again.stdout, again.stderr[-2000:]

    proc = framer_ds("train", config)
    assert proc.returncode == 0, proc.stderr[-4000:]
    train_lines, _ = read_metrics(tmp_path / "run")
    assert train_lines[-1]["step"] == 2 and np.isfinite(train_lines[-1]["loss"])
    record = json.loads((tmp_path / "run" / "final" / "tts_lm.json").read_text())
    assert record["speakers"] == []  # trained without a speaker prefix

    final = tmp_path / "run" / "final"
    refused = framer_ds("sample", final, "--text", "hello", "--speaker", "tara", "--device", "cpu")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "'tara' is not a speaker of this model; it was trained without data.speaker_prefix" in (
        refused.stdout + refused.stderr
    )
    out = tmp_path / "cloned.wav"
    reference = ljspeech / "wavs" / "LJ001-0000.wav"
    cloned = framer_ds(
        "sample", final, "--text", "lazy dog", "--reference-audio", reference, "--reference-text",
        "hello world", "--out", out, "--max-new-tokens", "28", "--device", "cpu",
    )  # fmt: skip
    assert cloned.returncode == 0, cloned.stderr[-3000:]
    assert "frames" in cloned.stdout and out.is_file()


# --- code and token files: gzipped, codebooks in columns of their own -------------------------------


def test_gzipped_code_and_token_files_and_split_code_columns_give_the_same_sequences(tmp_path, tiny_tts):
    """Corpora ship codes as `codes_0/1/2` columns and as .jsonl.gz; both read as the plain file does,
    and a damaged gzip is one line naming the file."""
    rows = [json.loads(line) for line in (tiny_tts / "data" / "train.jsonl").read_text().splitlines()[:6]]

    def sequences(path: Path, **data):
        config = write_config(tmp_path / "c.yaml", tmp_path / "run", source={"path": str(path)}, **data)
        return [s.input_ids for s in load_task(config).data.build_sequences().train]

    def gz(path: Path, table: list[dict]) -> Path:
        with gzip.open(path, "wt") as out:
            out.writelines(json.dumps(row) + "\n" for row in table)
        return path

    reference = sequences(write_jsonl(tmp_path / "rows.jsonl", rows), val_fraction=0)
    assert len(reference) == 6
    assert sequences(gz(tmp_path / "rows.jsonl.gz", rows), val_fraction=0) == reference
    split = [{"text": r["text"], **{f"audio_{b}": r["codes"][b] for b in range(3)}} for r in rows]
    assert (
        sequences(gz(tmp_path / "split.jsonl.gz", split), codes_column="audio", val_fraction=0) == reference
    )
    tokens = gz(tmp_path / "tokens.jsonl.gz", [{"input_ids": ids} for ids in reference])
    assert sequences(tokens, format="tokens", val_fraction=0) == reference

    from framer_ds.config.errors import ConfigError

    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(b'{"text": "a"}\n' * 50)[:40])
    with pytest.raises(ConfigError, match=r"cut.jsonl.gz: not a readable gzip file after line \d+"):
        sequences(tmp_path / "cut.jsonl.gz", val_fraction=0)


# --- sample: the speaker and the reference pair ----------------------------------------------------


def test_sample_refuses_an_unknown_speaker_listing_the_known_ones():
    from framer_ds.config.errors import ConfigError
    from framer_ds.tasks.tts_lm.inference import check_speaker

    record = {"speakers": ["ana", "ben"]}
    check_speaker(record, "ana")
    check_speaker({}, "anyone")  # an export from before the record listed its speakers
    with pytest.raises(ConfigError, match=r"'zed' is not a speaker of this model; known speakers: ana, ben"):
        check_speaker(record, "zed")


def test_a_reference_clip_needs_its_text_and_must_exist(tmp_path):
    from framer_ds.config.errors import ConfigError
    from framer_ds.tasks.tts_lm.inference import LAYOUT_RECORD, TtsSampleCommandOptions, sample_command

    with pytest.raises(ValueError, match="--reference-audio and --reference-text go together"):
        TtsSampleCommandOptions(text=["hi"], reference_audio=tmp_path / "ref.wav")
    (tmp_path / LAYOUT_RECORD).write_text(json.dumps({"special_tokens": {}, "speakers": []}))
    options = TtsSampleCommandOptions(text=["hi"], reference_audio=tmp_path / "no.wav", reference_text="a")
    with pytest.raises(ConfigError, match=r"--reference-audio: .*no.wav does not exist"):
        sample_command(None, tmp_path, options)  # refused before any model or codec is loaded


def test_a_speaker_column_becomes_the_orpheus_prefix_and_the_export_lists_the_speakers(tmp_path, tiny_tts):
    """Orpheus formats a voice's prompt as f"{voice}: {prompt}" (canopyai/Orpheus-TTS 835ac7cd,
    orpheus_tts_pypi/orpheus_tts/engine_class.py line 80): training rows get the same prefix."""
    rows = [json.loads(line) for line in (tiny_tts / "data" / "train.jsonl").read_text().splitlines()[:4]]
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    config = write_config(
        tmp_path / "c.yaml", tmp_path / "run", source={"path": str(data)}, speaker_column="speaker",
        speaker_prefix=True, val_fraction=0,
    )  # fmt: skip
    task = load_task(config)
    built = task.data.build_sequences()
    tokenizer, special = task.assets.tokenizer, task.assets.special
    first = built.train[0].input_ids
    text_ids = tokenizer.encode(f"{rows[0]['speaker']}: {rows[0]['text']}", add_special_tokens=False)
    assert first[: len(text_ids) + 2] == [special.start_of_human, special.start_of_text, *text_ids]
    assert task.data.speakers == sorted({row["speaker"] for row in rows})


def test_a_folder_layouts_subfolders_are_the_speakers_of_the_prefix(tmp_path, tiny_tts):
    folder = tmp_path / "voices"
    for speaker, voice in (("ana", "en"), ("ben", "en+m3")):
        speak("hello world", folder / speaker / "0.wav", voice)
        (folder / speaker / "0.txt").write_text("hello world")
    config = audio_config(tmp_path, folder, "folder", speaker_prefix=True, val_fraction=0)
    task = load_task(config)
    assert "2 encoded (2 this run), 0 failed" in task.encode_data()
    built = task.data.build_sequences()
    assert task.data.speakers == ["ana", "ben"]
    tokenizer = task.assets.tokenizer
    for sequence, speaker in zip(built.train, ("ana", "ben"), strict=True):
        prefixed = tokenizer.encode(f"{speaker}: hello world", add_special_tokens=False)
        assert sequence.input_ids[2 : 2 + len(prefixed)] == prefixed


def test_the_reference_pair_is_a_whole_training_sequence_before_the_prompt(tmp_path, ljspeech, tiny_tts):
    from framer_ds.tasks.tts_lm.inference import reference_prompt
    from framer_ds.tasks.tts_lm.snac_codec import load_codec, read_audio

    config = write_config(tmp_path / "c.yaml", tmp_path / "run", source={"builtin": "tiny_speech"})
    task = load_task(config)
    builder, special = task.data.builder(), task.assets.special
    codec = load_codec(tiny_tts / "codec")
    reference = ljspeech / "wavs" / "LJ001-0001.wav"
    prompt = reference_prompt(builder, codec, reference, SENTENCES[1])
    text = builder.text_ids(SENTENCES[1])
    frames = int(np.ceil(len(read_audio(reference, 24000)) / 2048))
    head = [special.start_of_human, *text, special.end_of_text, special.end_of_human]
    assert prompt[: len(head) + 2] == [*head, special.start_of_ai, special.start_of_speech]
    audio = prompt[len(head) + 2 : -2]
    assert len(audio) == 7 * frames and all(task.assets.layout.is_audio(t) for t in audio)
    assert prompt[-2:] == [special.end_of_speech, special.end_of_ai]  # a finished turn; the prompt follows
