"""Post-training calibration of the confidence head (sequential temperature scaling)."""
