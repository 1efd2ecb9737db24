"""Sampling shows a progress bar on a terminal (denoising steps of a video, generated tokens of speech),
and none in a log file or on a rank other than the main one."""

from __future__ import annotations

import io

import pytest

import framer_ds.tasks.tts_lm.speech as speech
from conftest import REPO
from framer_ds.data.progress import sampling_progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_shows_on_a_terminal_only_and_never_when_told_not_to():
    terminal = Terminal()
    with sampling_progress(4, "sample", file=terminal) as bar:
        assert not bar.disable
        bar.update(4)
    assert "sample" in terminal.getvalue()
    log = io.StringIO()
    with sampling_progress(4, "sample", file=log) as bar:
        assert bar.disable
    assert log.getvalue() == ""
    assert sampling_progress(4, "sample", show=False, file=Terminal()).disable  # another rank


@pytest.mark.parametrize("tty", [True, False])
def test_speech_generation_counts_its_tokens_on_the_bar(tmp_path, monkeypatch, tty):
    """On a terminal every generated token (the stop token too) moves the bar; elsewhere generation
    runs without a streamer (no per-token copy to the CPU)."""
    from framer_ds.tasks.registry import get_task_class
    from framer_ds.tasks.run_config import load_run_config
    from framer_ds.tasks.tts_lm.tiny import ensure_tiny_tts
    from framer_ds.tasks.tts_lm.token_sequences import generation_prompt

    ensure_tiny_tts()
    config = load_run_config(REPO / "configs/tasks/tts_lm/tiny.yaml", [f"output_dir={tmp_path}"])
    task = get_task_class("tts_lm")(config)
    model = task.build_model().eval()
    special = task.assets.special
    bars = []

    def recording(total, desc, show=True):
        bar = sampling_progress(total, desc, show, file=Terminal() if tty else io.StringIO())
        bars.append((bar, bar.disable))  # closing a bar disables it: remember how it started
        return bar

    monkeypatch.setattr(speech, "sampling_progress", recording)
    options = dict(min_new_tokens=0, temperature=1.0, top_p=1.0, repetition_penalty=1.0, seed=0)
    tokens = speech.generate_audio_tokens(
        model,
        generation_prompt([5, 6, 7], special),
        special,
        max_new_tokens=14,
        constrain_slots=True,
        show_progress=True,
        **options,
    )
    ((bar, disabled),) = bars
    assert bar.total == 14 and disabled is not tty
    if tty:
        assert len(tokens) <= bar.n <= 14 and bar.n > 0
    else:
        assert bar.n == 0
