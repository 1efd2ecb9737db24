"""The LoRA options every adapter-training task shares; each task subclasses them with its own targets."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from framer_ds.config.schema import StrictModel


class LoraBase(StrictModel):
    rank: int = Field(16, ge=1, description="LoRA rank r: trainable size and capacity grow with it.")
    alpha: float = Field(
        16.0, gt=0, description="LoRA scaling numerator: the update is scaled by alpha / rank."
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the LoRA branch input.")
    init: Literal["gaussian", "default", "pissa", "olora"] = Field(
        "gaussian", description="peft init_lora_weights."
    )

    def peft_init(self) -> bool | str:
        """peft's `init_lora_weights` value for `init`."""
        return True if self.init == "default" else self.init
