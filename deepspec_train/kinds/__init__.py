"""Drafter kinds (DSpark, DFlash, EAGLE-3, DFlash2): one record per kind that answers every kind-dependent question,
each with its serving round beside it, the drafter builder, and the one validation of a recipe (its types and
rules, its kind's, its target's: ``recipe_validation``). The serving layouts the kinds export to are records
of their own (``deepspec_train.serving_layouts``)."""
