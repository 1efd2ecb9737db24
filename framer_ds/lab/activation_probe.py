"""What the activation probe measured (lab/activations.py): the activation bytes of one rank's
micro-batch as a line, fixed + per sample x k, and the evaluation transient.

Why apart from the probe: a plan read from the cache (lab/plan_inputs.py) and the tests build these
without the probe's machinery (fake tensors, the tracker).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ActivationProbe:
    """Activation bytes of one rank's micro-batch: fixed + per_sample x k, fitted from two measurements."""

    micro_batches: tuple[int, ...]
    measured_bytes: tuple[int, ...]
    fixed: int
    per_sample: int
    gradient_checkpointing: bool
    device: str
    eval_transient: int = 0
    """Peak of what evaluation computes beyond the training step (the planning hook `eval_transient`),
    no_grad."""
    depth: tuple[int, ...] = ()
    """(probed block counts..., full block count) when the figures were extended from a shallower
    model (lab/activations.py); () when the model ran at its full depth."""

    def at(self, micro_batch: int) -> int:
        return max(0, self.fixed + self.per_sample * micro_batch)

    def as_dict(self) -> dict[str, Any]:
        return {
            "micro_batches": list(self.micro_batches),
            "measured_bytes": list(self.measured_bytes),
            "fixed_bytes": self.fixed,
            "per_sample_bytes": self.per_sample,
            "gradient_checkpointing": self.gradient_checkpointing,
            "device": self.device,
            "eval_transient_bytes": self.eval_transient,
            "depth": list(self.depth),
        }

    @classmethod
    def from_dict(cls, found: dict[str, Any]) -> ActivationProbe:
        """The probe `as_dict` wrote (the plan cache, lab/plan_inputs.py)."""
        return cls(
            micro_batches=tuple(found["micro_batches"]),
            measured_bytes=tuple(found["measured_bytes"]),
            fixed=found["fixed_bytes"],
            per_sample=found["per_sample_bytes"],
            gradient_checkpointing=found["gradient_checkpointing"],
            device=found["device"],
            eval_transient=found["eval_transient_bytes"],
            depth=tuple(found["depth"]),
        )
