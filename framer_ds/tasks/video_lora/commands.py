"""The commands video_lora contributes to `framer-ds data` (tasks/registry.py lists this module).

Imports nothing heavy: every `framer-ds` process reads this declaration to build its parser; the task
(diffusers, peft) is imported only when a command runs, by the CLI building it from the config."""

from __future__ import annotations

from typing import TYPE_CHECKING

from framer_ds.tasks.registry import TaskCommand

if TYPE_CHECKING:
    from framer_ds.tasks.video_lora.task import VideoLoraTask


def _compute_tracks(task: VideoLoraTask, shard: tuple[int, int]) -> str:
    """Needs only the videos, not `prepare_data`'s scores; each launched process tracks its share."""
    return task.compute_tracks(shard)


COMMANDS = (
    TaskCommand(
        "tracks",
        help="precompute point tracks of a config's videos (data.tracks) for Framer's trajectory branch; "
        "under `accelerate launch -m framer_ds data tracks ...` every process tracks its share",
        run=_compute_tracks,
    ),
)
