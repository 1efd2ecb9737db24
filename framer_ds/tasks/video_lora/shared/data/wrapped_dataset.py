"""One way for a dataset wrapper to show what it wraps.

Why: wrappers stack (clips -> motion buckets -> point heatmaps), and what reads a dataset from outside
(the latent cache key reads `motion_fingerprint`, `records`, `index`; reports read `failures`) must
see through every layer. The guard matters: while a DataLoader worker unpickles a wrapper, its wrapped
dataset is not set yet, and looking it up through `__getattr__` would recurse forever.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ForwardsToWrapped:
    """Attributes a wrapper does not have are those of the dataset in its `wrapped_attribute`."""

    wrapped_attribute: ClassVar[str] = "dataset"

    def __getattr__(self, name: str) -> Any:
        if name == self.wrapped_attribute:  # not set yet: unpickling in a DataLoader worker
            raise AttributeError(name)
        return getattr(getattr(self, self.wrapped_attribute), name)
