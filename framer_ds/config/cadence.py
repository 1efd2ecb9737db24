"""`Cadence`: how long or how often, in exactly one unit: optimizer steps, epochs, or a fraction of the run.

Why one type: the run's length (`max_steps` / `epochs`), the warmup (`warmup_steps` / `warmup_ratio`),
evaluation and checkpoints (`*_every` / `*_every_epochs`) used to be four pairs of keys with a validator
for "not both", and `max_steps` silently won over `epochs`. Now each is one value that says its unit,
two units at once are an error, and one method turns any of them into optimizer steps.

Each use states the units it takes in its description (`train.length`: steps or epochs, since a fraction
of the run cannot define the run). The units are one one-of group: an override of one unit replaces the
cadence's unit (`train.length.steps=4` on `length: {epochs: 3}`), by the rule every one-of group follows
(framer_ds.config.one_of).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from framer_ds.config.strict import StrictModel

UNITS = ("steps", "epochs", "fraction")


class Cadence(StrictModel):
    """Exactly one of `steps`, `epochs` or `fraction`."""

    one_of: ClassVar[tuple[tuple[str, ...], ...]] = (UNITS,)

    steps: int | None = Field(None, ge=1, description="Optimizer steps.")
    epochs: float | None = Field(
        None,
        gt=0,
        description="Epochs (passes over the training set; fractions allowed), converted with the optimizer "
        "steps per epoch at the run's number of processes, so it means the same on 1 or 16 processes.",
    )
    fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="A share of the run's optimizer steps (0 < fraction <= 1); not for train.length.",
    )

    @model_validator(mode="after")
    def _exactly_one_unit(self) -> Cadence:
        given = self.units_given()
        if len(given) != 1:
            found = f"got {' and '.join(given)}" if given else "got none"
            raise ValueError(
                f"set exactly one of steps, epochs or fraction ({found}): they say the same thing in "
                "different units"
            )
        return self

    @model_serializer(mode="wrap")
    def _only_the_unit_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """`{epochs: 3}`, not `{steps: null, epochs: 3, fraction: null}`: a recorded config reads back
        as the same single-unit cadence."""
        return {unit: value for unit, value in handler(self).items() if value is not None}

    def units_given(self) -> list[str]:
        return [unit for unit in UNITS if getattr(self, unit) is not None]

    def resolve(self, updates_per_epoch: int, total_steps: int | None = None) -> int:
        """Optimizer steps: `steps` as is, `epochs` x steps per epoch, `fraction` x the run's total steps,
        rounded up (a share of a step still asks for that step); the one conversion every use makes.

        The products are rounded up exactly as written (no tolerance), as `warmup_ratio` was, so a run
        keeps its warmup and its losses bit for bit across the rename."""
        if self.steps is not None:
            return self.steps
        if self.epochs is not None:
            return math.ceil(self.epochs * updates_per_epoch)
        if total_steps is None:
            raise ValueError("a fraction of the run needs the run's total steps")
        return math.ceil(self.fraction * total_steps)

    def fires(
        self, step: int, epoch_before: float, epoch_now: float, updates_per_epoch: int, total: int
    ) -> bool:
        """Whether an action on this cadence is due after optimizer step `step`, which moved the data
        position from `epoch_before` to `epoch_now` (in epochs).

        An epoch cadence fires on the step that crosses the next multiple of `epochs`, so it lands at the
        same point of the data on 1 or 16 processes, where a step count converted once would drift by
        rounding (22 of 45 steps is not half an epoch). Steps and fractions fire every `resolve` steps."""
        if self.epochs is not None:
            before, now = epoch_before / self.epochs, epoch_now / self.epochs
            return math.floor(now + 1e-9) > math.floor(before + 1e-9)
        return step % self.resolve(updates_per_epoch, total) == 0

    def describe(self, updates_per_epoch: int, total_steps: int) -> str:
        """For the run summary: the cadence in its own unit and in the other one."""
        if self.epochs is not None:
            return f"every {self.epochs:g} epochs (about {self.epochs * updates_per_epoch:.3g} steps)"
        steps = self.resolve(updates_per_epoch, total_steps)
        share = f"{self.fraction:g} of the run: " if self.fraction is not None else ""
        return f"every {share}{steps} steps ({steps / updates_per_epoch:.3g} epochs)"

    @classmethod
    def migrate_recorded(cls, section: Any) -> Any:
        """A cadence an older framer_ds recorded from a pair of keys: it wrote both units, the unused one
        as null (`eval_every: null`), a warmup of none as `warmup_steps: 0`, and the run's length as
        `max_steps: 100` AND `epochs: 1`, where max_steps won. Keep the unit that was in effect (steps
        first, as max_steps won), or null when none was."""
        if not isinstance(section, dict) or not set(section) <= set(UNITS):
            return section  # not the shape this migration knows: validation reports it
        meant = [unit for unit in UNITS if section.get(unit) not in (None, 0)]
        return {meant[0]: section[meant[0]]} if meant else None


def units_check(value: Cadence | None, accepted: tuple[str, ...], why: str) -> Cadence | None:
    """A use that takes only some units (`train.length`: not a fraction of itself) refuses the others."""
    if value is not None and value.units_given()[0] not in accepted:
        raise ValueError(f"takes {' or '.join(accepted)}, not {value.units_given()[0]} ({why})")
    return value
