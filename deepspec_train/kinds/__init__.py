"""Drafter kinds (DSpark, DFlash, EAGLE-3, DFlash2): one record per kind that answers every kind-dependent question,
each with its serving round beside it, and the drafter builder. The serving layouts the kinds export to are records
of their own (``deepspec_train.serving_layouts``)."""
