"""Install the carried wheels (`.whl/`) whose distributions this Python lacks, into a target directory.

Why only the missing ones: the GPU image has its own torch, transformers and CUDA stack, which the suite
must measure as they are; two versions of one package on the path would make the figures unclear.
Usage: python install_wheels.py WHEEL_DIR TARGET (then put TARGET on PYTHONPATH).
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import time
from pathlib import Path


def distribution(wheel: Path) -> str:
    """The distribution name of a wheel file, normalised (PEP 503)."""
    return re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()


def installed(name: str, target: Path) -> bool:
    paths = [str(target), *sys.path]
    return any(True for _ in importlib.metadata.distributions(name=name, path=paths))


def main(wheel_dir: Path, target: Path) -> None:
    started = time.monotonic()
    wheels = sorted(wheel_dir.glob("*.whl"))
    missing = [w for w in wheels if not installed(distribution(w), target)]
    if missing:
        command = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--upgrade",
            "--target",
            str(target),
            *map(str, missing),
        ]
        subprocess.run(command, check=True)
    names = ", ".join(distribution(w) for w in missing) or "nothing"
    print(f"installed {names} into {target} in {time.monotonic() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
