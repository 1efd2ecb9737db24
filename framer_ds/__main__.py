"""`python -m framer_ds` is the same CLI as `framer-ds` (so `accelerate launch -m framer_ds` works).

The stop signals are handled before anything else is imported: a SIGTERM in the first second of a
run (Slurm preempting a job that had just started) must give exit 75 and preempted.json, not 143."""

from framer_ds.train.preemption import EARLY_STOP

EARLY_STOP.arm()

from framer_ds.cli.main import run  # noqa: E402  (after the signal handlers, on purpose)

if __name__ == "__main__":
    run()
