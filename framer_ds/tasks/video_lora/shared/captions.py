"""The caption rule of the text-conditioned bases (Wan, LTX-2): each clip's prompt is the run's fixed
prompt, else its manifest row's caption, else `<video stem>.txt` beside the video; a clip with none is a
problem named by its caption file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from framer_ds.config.errors import ConfigProblem

CAPTION_SUFFIX = ".txt"
SMOKE_CAPTION = "a red ball rolls"  # the caption of `framer-ds smoke`'s synthetic clips


def caption_file(video: Path) -> Path:
    """The caption rule: `<video stem>.txt` beside the video."""
    return Path(video).with_suffix(CAPTION_SUFFIX)


def clip_prompts(records: list[Any], fixed: str | None) -> tuple[dict[str, str], list[ConfigProblem]]:
    """{video_id: prompt} for every record, and one problem per video without a caption: the fixed
    prompt, else a manifest row's caption, else the caption file."""
    prompts, problems = {}, []
    for record in records:
        if fixed is not None:
            prompts[record.video_id] = fixed
        elif getattr(record, "caption", None):
            prompts[record.video_id] = record.caption.strip()
        elif caption_file(record.path).is_file():
            prompts[record.video_id] = caption_file(record.path).read_text(encoding="utf-8").strip()
        else:
            problems.append(
                ConfigProblem(
                    "model.base.prompt",
                    f"{caption_file(record.path)} is missing: write the clip's caption there, or set "
                    "model.base.prompt to one prompt for every clip",
                )
            )
    return prompts, problems


class CaptionedClips:
    """The caption glue of a text-conditioned family (Wan, LTX-2), once: the data check names every clip
    without a prompt, the indexed clips' prompts are kept for encoding (`prompts`), and `framer-ds smoke`
    reads captions and samples with one. Mixed into the family before `VideoBaseFamily`."""

    config: Any

    def __init__(self, config: Any):
        super().__init__(config)  # type: ignore[call-arg]
        self.prompts: dict[str, str] = {}  # video_id -> prompt, from `note_records`

    def record_problems(self, records: Callable[[], list[Any]]) -> list[ConfigProblem]:
        """A clip without a caption (and no fixed prompt), named by its caption file."""
        if self.config.model.base.prompt is not None:
            return []
        return clip_prompts(records(), None)[1]

    def note_records(self, records: list[Any]) -> None:
        self.prompts.update(clip_prompts(records, self.config.model.base.prompt)[0])

    @property
    def reads_captions(self) -> bool:
        return self.config.model.base.prompt is None

    def smoke_sample_flags(self, samples: Any, caption: str) -> list[str]:
        return ["--prompt", self.config.model.base.prompt or caption]
