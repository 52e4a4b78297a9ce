"""The one exception type readers raise for bad input; it becomes a row of rejects.parquet."""

from __future__ import annotations

from lidarshard.schemas import REJECT_REASONS

__all__ = ["RejectError", "RejectValueError"]


class RejectError(Exception):
    """Bad input with a reason from ``lidarshard.schemas.REJECT_REASONS`` and a human-readable detail."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in REJECT_REASONS:
            raise ValueError(f"unknown reject reason {reason!r}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class RejectValueError(RejectError, ValueError):
    """A ``RejectError`` that is also a ``ValueError``: raised by pure functions the loaders call too
    (``multisweep.aggregate``), where a bad value has always been a ``ValueError``; the scan files it
    under its reason like any ``RejectError``."""
