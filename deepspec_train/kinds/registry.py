"""The drafter kinds the pipeline knows, by name: ``kind_spec(cfg.drafter.kind)`` is how every other module asks
a question whose answer depends on the kind (see ``kinds.spec``). A new kind is one more record here."""

from __future__ import annotations

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.kinds.dflash2 import DFLASH2
from deepspec_train.kinds.eagle3 import EAGLE3
from deepspec_train.kinds.parallel import DFLASH, DSPARK
from deepspec_train.kinds.spec import DrafterKind

KINDS: dict[str, DrafterKind] = {spec.name: spec for spec in (DSPARK, DFLASH, EAGLE3, DFLASH2)}


def kind_spec(name: str) -> DrafterKind:
    """The record of drafter kind ``name``; a one-line error naming the known kinds otherwise."""
    if name not in KINDS:
        raise ValueError(f"unknown drafter kind {name!r}; known kinds: {', '.join(KINDS)}")
    return KINDS[name]


def kind_of_export(layout: str, drafter: DrafterConfig) -> DrafterKind:
    """The kind of drafter an export in ``layout`` holds, from the ``drafter`` settings its config reads back as:
    the one kind that exports to that layout with those labels and holds those settings."""
    matches = [
        spec for spec in KINDS.values() if layout in spec.layouts(drafter.labels) and spec.holds_export(drafter)
    ]
    if len(matches) != 1:
        raise ValueError(f"a {layout} export config matches {len(matches)} drafter kinds: {[s.name for s in matches]}")
    return matches[0]
