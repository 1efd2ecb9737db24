"""Where framer_ds keeps files and how it writes them (atomic, durable); the bottom layer."""
