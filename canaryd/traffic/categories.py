"""Which live category a mirrored request belongs to, and who may say so.

A live category becomes a metric label, a row of pairs judged on their own, a key of the
per-category switch and a line of `canaryd status`, so production's users must not be
able to make new ones. The category comes from one place only: the header named by
`traffic.category_header`, which the gateway sets on the mirrored copy (after stripping
any the client sent), and only when `traffic.categories` lists its value. Nothing the
client controls — the body's `model`, the path — names a category. A request whose
header is absent or names an unlisted category is the generic `live` category, or, with
`traffic.unknown_category = "refuse"`, is refused (counted `unlisted`, never sampled).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

from canaryd.config import TrafficConfig
from canaryd.traffic.requests import LIVE_CATEGORY, category_label

__all__ = ["MAX_HEADER_CHARS", "CategoryPolicy"]

# A header value longer than this names no category (the longest category is 32).
MAX_HEADER_CHARS: Final = 256


class CategoryPolicy:
    """The allowlist of live categories and what an unlisted request gets."""

    def __init__(self, allowed: Iterable[str], unknown: Literal["live", "refuse"] = "live") -> None:
        self.allowed = frozenset(allowed)
        self.unknown = unknown

    @classmethod
    def of(cls, config: TrafficConfig) -> CategoryPolicy:
        """The policy `[traffic]` configures (`categories`, `unknown_category`)."""
        return cls(config.categories, config.unknown_category)

    def listed(self, header_value: str | None) -> str | None:
        """The category the gateway's header names when the allowlist has it (matched
        as a category name: case and separators folded), else None."""
        if not header_value or len(header_value) > MAX_HEADER_CHARS:
            return None
        label = category_label(header_value)
        return label if label in self.allowed else None

    def category(self, header_value: str | None) -> str | None:
        """The request's live category: the listed one, else `live`; None when it is
        to be refused (`unknown_category = "refuse"` and nothing listed named)."""
        listed = self.listed(header_value)
        if listed is not None:
            return listed
        return LIVE_CATEGORY if self.unknown == "live" else None
