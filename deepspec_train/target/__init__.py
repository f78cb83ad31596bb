"""The frozen target: loading it, tapping its hidden states, and reading its embedding / LM-head weights."""
