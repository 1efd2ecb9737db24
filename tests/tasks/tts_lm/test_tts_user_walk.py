"""What a newcomer hit walking docs/tts_lm.md on a small LJSpeech folder made with espeak-ng (the tiny
config with the documented overrides): a clip metadata.csv lists but wavs/ lacks, a speaker prefix that
could name no speaker, a quality gate skipped for a reason the line did not say, and the documented
commands themselves."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_tts_audio_layouts import audio_config, speak
from test_tts_lm import framer_ds, load_task, write_config, write_jsonl

from framer_ds.config.errors import ConfigError

DOCS = Path(__file__).resolve().parents[3] / "docs" / "tts_lm.md"


def test_a_clip_that_metadata_lists_but_wavs_lacks_is_named_missing_not_unreadable(tmp_path, tiny_tts):
    """soundfile says "System error." for a missing file, and the line told the user to convert it to
    wav or flac; the fix is to add the file or drop its line."""
    root = tmp_path / "LJSpeech"
    speak("hello world", root / "wavs" / "LJ001-0001.wav")
    (root / "metadata.csv").write_text("LJ001-0001|hello world|hello world\nLJ001-0002|gone|gone\n")
    report = load_task(audio_config(tmp_path, root, "ljspeech", val_fraction=0)).encode_data()
    assert "1 encoded (1 this run), 1 failed" in report
    (line,) = [line for line in report.splitlines() if "LJ001-0002.wav" in line]
    assert "no such file; add it, or drop the row that names it" in line and "convert" not in line


def test_a_speaker_prefix_on_an_ljspeech_layout_is_refused_before_training_only(tmp_path, tiny_tts):
    """LJSpeech is one voice: with data.speaker_prefix (the tiny config sets it) nothing was prefixed and
    the export listed no speaker, so `sample --speaker` then said it was trained without the prefix.
    validate / train refuse it; a run already trained that way still loads (eval, sample)."""
    root = tmp_path / "LJSpeech"
    speak("hello world", root / "wavs" / "LJ001-0001.wav")
    (root / "metadata.csv").write_text("LJ001-0001|hello world|hello world\n")
    config = audio_config(tmp_path, root, "ljspeech", speaker_prefix=True, speaker_column="speaker")
    task = load_task(config)  # what `framer-ds eval` and `sample` load: no error
    assert [str(p) for p in task.check()] == [
        "data.speaker_prefix: an 'ljspeech' layout names no speakers (one voice): set data.speaker_prefix "
        "false"
    ]
    proc = framer_ds("validate", config)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    assert "'ljspeech' layout names no speakers" in proc.stdout + proc.stderr


def test_a_speaker_prefix_whose_rows_name_no_speaker_is_refused(tmp_path, tiny_tts):
    """Rows without the speaker column (or a folder layout's clips all at its top level): the flag would do
    nothing, silently; validate names the column and both fixes."""
    rows = [json.loads(line) for line in (tiny_tts / "data" / "train.jsonl").read_text().splitlines()[:4]]
    data = write_jsonl(tmp_path / "rows.jsonl", [{"text": r["text"], "codes": r["codes"]} for r in rows])
    config = write_config(
        tmp_path / "c.yaml", tmp_path / "run", source={"path": str(data)}, speaker_column="voice",
        speaker_prefix=True, val_fraction=0,
    )  # fmt: skip
    (problem,) = load_task(config).check()
    assert re.fullmatch(
        r"data.speaker_prefix: no row of .*rows.jsonl names a speaker in column 'voice': set "
        r"data.speaker_column to the column that does, or set data.speaker_prefix false",
        str(problem),
    )
    named = write_jsonl(tmp_path / "named.jsonl", [{**rows[0], "voice": "ana"}, *rows[1:]])
    assert load_task(config, f"data.source.path={named}").check() == []  # one named row is enough
    flat = tmp_path / "flat"
    speak("hello world", flat / "a.wav")
    (flat / "a.txt").write_text("hello world")
    (problem,) = load_task(audio_config(tmp_path, flat, "folder", speaker_prefix=True)).check()
    folder_fix = r"data.speaker_prefix: no clip of .*flat lies in a speaker subfolder: .*"
    assert re.fullmatch(folder_fix, str(problem))


def test_a_gate_skipped_for_a_config_reason_says_the_reason():
    """`framer-ds eval` on a run without a codec printed "skipped: ConfigError: 1 problem(s) in config":
    the count, not the problem (a ConfigError's first line is its header)."""
    from framer_ds.config.errors import ConfigProblem
    from framer_ds.tasks.tts_lm.quality.gates import score

    def no_codec():
        raise ConfigError([ConfigProblem("model.codec.path", "the quality gates need the SNAC codec")])

    special = SimpleNamespace(end_of_speech=2)
    lines: list[str] = []
    metrics = score([], [[5, 2]], SimpleNamespace(special=special), no_codec, lines.append)
    assert metrics == {"eval/eos_rate": 1.0}
    assert lines == [
        "eval/wer, eval/speaker_similarity, eval/seconds_per_text_token skipped: "
        "model.codec.path: the quality gates need the SNAC codec"
    ]


def documented_walk() -> list[list[str]]:
    """The `framer-ds` commands of docs/tts_lm.md's "Try it on a small LJSpeech folder" block."""
    section = DOCS.read_text().split("### Try it on a small LJSpeech folder", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    joined = block.replace("\\\n", " ")
    return [shlex.split(line.split("#")[0]) for line in joined.splitlines() if line.startswith("framer-ds")]


def test_the_documented_ljspeech_walk_validates_with_a_held_out_set(tmp_path, tiny_tts, monkeypatch):
    """The overrides the docs give turn the shipped tiny config into an LJSpeech run that validates and
    holds out utterances, so `framer-ds eval` (the next command) has held-out texts to speak."""
    repo = DOCS.parents[1]
    root = tmp_path / "runs" / "LJSpeech-1.1"  # where the docs make it, under the working directory
    lines = [f"LJ001-{i:04d}|{t}|{t}" for i, t in enumerate(["hello world", "quick brown fox"] * 5)]
    for line in lines:
        speak(line.split("|")[1], root / "wavs" / f"{line.split('|')[0]}.wav")
    (root / "metadata.csv").write_text("\n".join(lines) + "\n")
    commands = documented_walk()
    verbs = [" ".join(c[1:3]) for c in commands]
    assert verbs[:2] == ["data encode-audio", "train configs/tasks/tts_lm/tiny.yaml"]
    assert any(v.startswith("eval") for v in verbs) and any("--speaker" in c for c in commands)
    assert any("--reference-audio" in c for c in commands)
    overrides = [arg for arg in commands[1][3:] if "=" in arg]
    assert overrides == [arg for arg in commands[0][4:] if "=" in arg]  # encode and train agree
    out = next(arg.split("=", 1)[1] for arg in overrides if arg.startswith("output_dir="))
    assert [c[2] for c in commands if c[1] == "eval"] == [out]  # eval and sample read that run
    assert f"{out}/final" in [c[2] for c in commands if c[1] == "sample"]
    monkeypatch.chdir(tmp_path)
    task = load_task(repo / "configs/tasks/tts_lm/tiny.yaml", *overrides, f"data.encoded_dir={tmp_path}")
    assert task.check() == []
    assert "10 encoded" in task.encode_data()
    built = task.data.build_sequences()
    assert len(built.eval) >= 1 and task.data.speakers == []


def test_a_sample_option_rule_reads_as_the_rule_not_pydantics_prefix():
    """`sample --reference-audio ref.wav` without its text printed "options: Value error, --reference-audio
    and ...": pydantic's prefix of a model validator's message, which config files already drop."""
    from framer_ds.cli.options import build_options_parser, parse_options
    from framer_ds.tasks.tts_lm.inference import TtsSampleCommandOptions

    parser = build_options_parser(TtsSampleCommandOptions, prog="sample", description="")
    with pytest.raises(ConfigError) as info:
        parse_options(TtsSampleCommandOptions, parser, ["--text", "hi", "--reference-audio", "ref.wav"])
    assert [str(p) for p in info.value.problems] == [
        "options: --reference-audio and --reference-text go together: the clip and what it says"
    ]
