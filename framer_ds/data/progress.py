"""The progress bar of sampling (video denoising steps, generated speech tokens), shared by the tasks.

Why: sampling a video or a sentence takes from seconds to minutes with nothing printed; training shows a
bar, sampling now does too. It shows on a terminal only: in a log file or captured output, redraws of a
bar are noise (a Slurm log of training keeps its own bar, which `framer-ds report` reads). Inside a
training run it sits under the training bar and disappears when done (`leave=False`), and only the main
process draws it.
"""

from __future__ import annotations

from typing import IO

from tqdm.auto import tqdm


def sampling_progress(total: int, desc: str, show: bool = True, file: IO[str] | None = None) -> tqdm:
    """A tqdm bar over `total` steps; disabled when `show` is False (a rank other than the main one)
    or when its stream (stderr) is not a terminal. Use as a context manager; `update()` per step."""
    return tqdm(
        total=total,
        desc=desc,
        disable=None if show else True,  # None: tqdm disables itself on a stream that is not a TTY
        leave=False,
        dynamic_ncols=True,
        mininterval=0.5,
        file=file,
    )
