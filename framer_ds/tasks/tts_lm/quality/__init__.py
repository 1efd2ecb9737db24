"""Offline quality gates for tts_lm: speech generated for held-out texts, scored without a network.

`scoring.py` holds the arithmetic (text normalisation, WER, end-of-speech rate, cosine), `scorers.py`
the offline models (pocketsphinx's ASR, Resemblyzer's speaker encoder, both shipping their weights in
their wheels, imported only when a gate runs), `gates.py` the pipeline from held-out sequences to
`eval/*` metrics, where a failing metric is one line and is skipped, never a crash.
"""
