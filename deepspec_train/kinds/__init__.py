"""Drafter kinds (DSpark, DFlash, EAGLE-3): one record per kind that answers every kind-dependent question."""
