"""DSpark's confidence scheduler: per-request verification lengths from calibrated confidences and a profiled
verification-speed table (used by ``deepspec simulate`` and the evaluator)."""
