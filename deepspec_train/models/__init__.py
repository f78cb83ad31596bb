"""Drafter models: Qwen3-style building blocks, the DSpark/DFlash parallel drafter, and target geometry."""
