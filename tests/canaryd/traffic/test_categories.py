"""Live categories only from the gateway's header and the allowlist: listed values (case
and separators folded), everything else `live` or refused."""

from __future__ import annotations

import pytest

from canaryd.config import TrafficConfig
from canaryd.traffic.categories import MAX_HEADER_CHARS, CategoryPolicy


class TestCategoryPolicy:
    def test_listed_values_are_categories(self) -> None:
        """A header value the allowlist holds is the category, matched as a category
        name (`Live-Code` is `live_code`)."""
        policy = CategoryPolicy(["live_code", "support"])
        assert policy.category("live_code") == "live_code"
        assert policy.category(" Live-Code ") == "live_code"
        assert policy.category("support") == "support"

    @pytest.mark.parametrize(
        "value", [None, "", "junk", "42", "live_code_x", "x" * (MAX_HEADER_CHARS + 1)]
    )
    def test_anything_else_is_live(self, value: str | None) -> None:
        """No header, an unlisted or unusable value: the generic `live` category."""
        assert CategoryPolicy(["live_code"]).category(value) == "live"

    def test_refuse_gives_none_for_anything_unlisted(self) -> None:
        """With `refuse`, only listed values make a category; the rest are None."""
        policy = CategoryPolicy(["live_code"], "refuse")
        assert policy.category("live_code") == "live_code"
        assert policy.category("junk") is None
        assert policy.category(None) is None

    def test_an_empty_allowlist_makes_everything_live(self) -> None:
        """The default configuration: no categories listed, every request is `live`."""
        policy = CategoryPolicy.of(TrafficConfig())
        assert policy.category("code") == "live"
        assert policy.allowed == frozenset()
