"""Offline speculative-decoding evaluation: exact verification of drafted blocks and acceptance measurement."""
