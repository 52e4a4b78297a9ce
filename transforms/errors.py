"""The one exception type readers raise for bad input; it becomes a row of rejects.parquet."""

from __future__ import annotations

from lidarshard.schemas import REJECT_REASONS

__all__ = ["RejectError"]


class RejectError(Exception):
    """Bad input with a reason from ``lidarshard.schemas.REJECT_REASONS`` and a human-readable detail."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in REJECT_REASONS:
            raise ValueError(f"unknown reject reason {reason!r}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
