"""deepspec_train: train DSpark speculative-decoding drafters (and DFlash / EAGLE-3 baselines) from a target
LLM's streamed pre-LM-head hidden states. Entry points: ``train.py`` and the ``deepspec`` console script."""

__version__ = "0.1.0"
