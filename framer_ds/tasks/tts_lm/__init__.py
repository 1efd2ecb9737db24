"""The `tts_lm` task: a causal LM trained on text followed by SNAC audio tokens."""
