"""`framer-ds` command line: parse, call, print. No training logic lives here."""
