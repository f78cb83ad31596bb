"""Side-by-side comparison of trained drafters (``deepspec compare``): one row per drafter gathered from its run
directory or evaluation results, rendered as markdown tables, PNG plots and, optionally, W&B tables."""
