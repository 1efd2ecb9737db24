"""The bench's PNGs: peak memory, throughput and step time by strategy (a bar per process count), and
scaling efficiency across process counts. Failed cells are left out of the bars, never drawn as zero."""

from __future__ import annotations

from pathlib import Path

from framer_ds.lab.bench_rows import BenchRow


def _bars(rows: list[BenchRow], value, ylabel: str, title: str, path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strategies = list(dict.fromkeys(r.strategy for r in rows))
    counts = sorted({r.processes for r in rows})
    width = 0.8 / max(len(counts), 1)
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=100)
    drawn = False
    for i, n in enumerate(counts):
        xs, ys = [], []
        for j, strategy in enumerate(strategies):
            found = [value(r) for r in rows if r.strategy == strategy and r.processes == n and r.ok]
            if found and found[0] is not None:
                xs.append(j + (i - (len(counts) - 1) / 2) * width)
                ys.append(found[0])
        if xs:
            axes.bar(xs, ys, width=width, label=f"{n} process{'es' if n > 1 else ''}")
            drawn = True
    if not drawn:
        plt.close(figure)
        return None
    axes.set_xticks(range(len(strategies)), strategies)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(axis="y", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def _scaling(efficiency: dict[tuple[str, int], float], path: Path) -> Path | None:
    if not efficiency:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=100)
    for strategy in dict.fromkeys(s for s, _ in efficiency):
        points = sorted((n, e) for (s, n), e in efficiency.items() if s == strategy)
        axes.plot([n for n, _ in points], [e * 100 for _, e in points], marker="o", label=strategy)
    axes.set_xticks(sorted({n for _, n in efficiency}))
    axes.axhline(100, color="grey", linestyle="--", linewidth=1)
    axes.set_xlabel("processes")
    axes.set_ylabel("scaling efficiency (%)")
    axes.set_title("throughput at N processes / (N x throughput at the fewest)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def plot_bench(rows: list[BenchRow], efficiency: dict[tuple[str, int], float], out_dir: Path) -> list[Path]:
    memory = _bars(
        rows,
        lambda r: r.peak_mib,
        "peak tensor MiB per rank (largest)",
        "peak memory by strategy",
        out_dir / "memory.png",
    )
    speed = _bars(
        rows, lambda r: r.samples_per_s, "samples / s", "throughput by strategy", out_dir / "throughput.png"
    )
    step = _bars(
        rows, lambda r: r.s_per_step, "s / optimizer step", "step time by strategy", out_dir / "step_time.png"
    )
    plots = [memory, speed, step, _scaling(efficiency, out_dir / "scaling.png")]
    return [p for p in plots if p is not None]
