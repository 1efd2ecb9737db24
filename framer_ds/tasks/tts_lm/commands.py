"""The commands tts_lm contributes to `framer-ds data` (tasks/registry.py lists this module).

Imports nothing heavy: every `framer-ds` process reads this declaration to build its parser; the task
(transformers, SNAC) is imported only when a command runs, by the CLI building it from the config."""

from __future__ import annotations

from typing import TYPE_CHECKING

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.tasks.registry import TaskCommand

if TYPE_CHECKING:
    from framer_ds.tasks.tts_lm.task import TtsLmTask


def _encode_audio(task: TtsLmTask, shard: tuple[int, int]) -> str:
    """Encodes every manifest not yet cached, in this one process. Under a launcher that starts several
    processes each would encode everything into the same cache: refused, not silently repeated."""
    index, count = shard
    if count > 1:
        raise ConfigError(
            [
                ConfigProblem(
                    "data encode-audio",
                    f"started as process {index} of {count}: it encodes in one process (the codec batches "
                    "the files itself); run `framer-ds data encode-audio CONFIG` once, without a launcher",
                )
            ],
            "the launch",
        )
    return task.encode_data()


COMMANDS = (
    TaskCommand(
        "encode-audio",
        help="encode a config's audio files with its codec into the cache training reads (resumable)",
        run=_encode_audio,
    ),
)
