"""One cell of `framer-ds bench` (a strategy at a process count): what it measured or why it failed.

Why a module of its own: bench.py builds the rows and bench_plots.py draws them; both import the row
from here, one way (bench_plots once imported it from bench, which imported bench_plots: a cycle,
issue 32).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BenchRow:
    strategy: str
    processes: int
    ok: bool
    error: str = ""
    peak_mib_per_rank: list[float] = field(default_factory=list)
    """Tensors only: what a GPU's max_memory_allocated reports and what `framer-ds plan` models."""
    process_mib_per_rank: list[float] = field(default_factory=list)
    """Every allocation of the process (on a GPU the same figure; on a CPU also Python objects, gloo and
    DeepSpeed host structures, video decoding)."""
    s_per_step: float | None = None
    samples_per_s: float | None = None
    final_loss: float | None = None
    eval: dict[str, float] = field(default_factory=dict)
    wall_s: float | None = None
    profile: dict[str, float] | None = None
    hta: dict[str, float] | None = None
    traces: list[str] = field(default_factory=list)
    first_step_s: float | None = None
    """Optimizer step 1 (start-up excluded): warm-up, plus tracing and code generation under compile."""
    compile_s: float | None = None
    """`--compile` rows: step 1 compiled minus step 1 eager, same strategy and process count."""

    @property
    def peak_mib(self) -> float | None:
        return max(self.peak_mib_per_rank) if self.peak_mib_per_rank else None

    @property
    def process_mib(self) -> float | None:
        return max(self.process_mib_per_rank) if self.process_mib_per_rank else None
