"""What a token-shard build kept and skipped, for the whole split and for each of its sources.

Written beside the shards (``summary.json``) and read back on a cache hit, so a reused entry reports (and is
checked, ``usable_rows``) exactly as a fresh build. A source's record says which row shape it was read as and
whether ``data.format=auto`` chose it, the rows read, kept and skipped per reason, and the first skipped row's
``file:line``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SourceSummary:
    """One source's rows: read, kept, skipped per reason (``first_bad``: the first skipped row's reason, location
    and detail), tokens and supervised tokens of the kept ones, and the shape they were read as."""

    source: str
    shape: str | None = None
    detected: bool = False
    read: int = 0
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    first_bad: dict[str, str] | None = None
    total_tokens: int = 0
    supervised_tokens: int = 0

    def how_read(self) -> str:
        """E.g. ``question_answer (data.format=auto)``."""
        shape = self.shape or "no known row shape"
        return f"{shape} (data.format={'auto' if self.detected else self.shape})"

    def skipped_count(self) -> int:
        return sum(self.skipped.values())


@dataclass
class DataSummary:
    """What a build kept and skipped; ``first_bad`` is the location and reason of the first skipped row;
    ``sources`` the same per source, in the order given."""

    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    supervised_tokens: int = 0
    total_tokens: int = 0
    cache_path: str = ""
    from_cache: bool = False
    first_bad: dict[str, str] | None = None
    sources: list[SourceSummary] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Read back from ``summary.json``, the sources are plain mappings.
        self.sources = [s if isinstance(s, SourceSummary) else SourceSummary(**s) for s in self.sources]

    def format(self) -> str:
        """A human summary: one line for the kept samples, then one line per skip reason."""
        origin = "reused cache" if self.from_cache else "built cache"
        lines = [
            (
                f"kept {self.kept} conversations, {self.total_tokens} tokens, {self.supervised_tokens} supervised "
                f"({origin} {self.cache_path})"
            )
        ]
        for reason, count in sorted(self.skipped.items()):
            lines.append(f"skipped {count}: {reason}")
        return "\n".join(lines)

    def shapes(self) -> list[str]:
        """One line per source: the row shape it was read as and how, and the rows it kept."""
        return [f"{s.source}: read as {s.how_read()}, kept {s.kept} of {s.read} rows" for s in self.sources]
