"""Anchor sampling, packing of anchor blocks from several sequences, and the attention structure built from
packing metadata."""
