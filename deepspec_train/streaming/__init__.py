"""Streamed mode: target workers run the frozen target and send packed features to drafter workers over
torch.distributed point-to-point (roles, wire format, target loop, drafter-side source, failure detection)."""
