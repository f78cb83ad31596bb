"""The tiny world: a self-made corpus, tokenizer and Qwen3-architecture target that make the whole pipeline
runnable on a laptop CPU without downloading anything.

Modules: ``corpus`` (code / prose / math conversations from the local Python installation and generated word
problems), ``tokenizer_builder`` (byte-level BPE with ChatML specials and the mask token), ``target_training``
(train and score the target), ``presets`` (``test`` and ``small`` sizes), ``build`` (writes a tiny world to a
directory), ``phases`` (the build's phase lines and timings), ``cli`` (the ``deepspec tinyworld build`` verb).
Import them directly; this package imports nothing heavy.
"""
