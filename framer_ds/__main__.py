"""`python -m framer_ds` is the same CLI as `framer-ds` (so `accelerate launch -m framer_ds` works)."""

from framer_ds.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
