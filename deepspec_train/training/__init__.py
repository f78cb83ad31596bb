"""Training: feature sources, the drafter training loop, learning-rate schedule and entry points."""
