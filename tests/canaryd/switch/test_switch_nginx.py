"""`canaryd.switch.nginx`: the routes a state object asks for by the router rules, the map
rendered from them, and the map file's guarded replacement and reload."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from canaryd.switch.nginx import (
    BASELINE,
    SPECULATIVE,
    Routes,
    header_variable,
    map_generation,
    render_map,
    routes,
    write_map,
)

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
MAX_AGE = timedelta(minutes=5)


def state(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "speculative_enabled": True,
        "generation": 4,
        "reason": "restored",
        "categories": {},
        "confirmed_at": (NOW - timedelta(seconds=30)).isoformat(),
    }
    base.update(changes)
    return base


class TestRoutes:
    def test_a_confirmed_state_sends_each_category_by_its_own_switch(self) -> None:
        """Master on, one category off: that category to the baseline, the rest speculative."""
        found = routes(
            state(
                categories={
                    "code": {"speculative_enabled": False},
                    "chat": {"speculative_enabled": True},
                }
            ),
            now=NOW,
            max_age=MAX_AGE,
        )
        assert (found.default, found.overrides, found.generation) == (
            SPECULATIVE,
            {"code": BASELINE},
            4,
        )
        assert found.why == "speculation on except code"

    @pytest.mark.parametrize(
        ("data", "why"),
        [
            (None, "no readable state file"),
            (state(speculative_enabled=False, reason="pager"), "switch off: pager"),
            (state(pending_sync=True), "kill switch written while the database was down"),
            (state(confirmed_at=None), "never confirmed"),
            (state(confirmed_at=(NOW - timedelta(minutes=6)).isoformat()), "state stale"),
            (state(confirmed_at="yesterday"), "never confirmed"),
        ],
    )
    def test_anything_but_a_fresh_enabled_state_sends_everyone_to_the_baseline(
        self, data: dict[str, Any] | None, why: str
    ) -> None:
        """Missing, off, pending, unconfirmed or stale: speculation off for every request."""
        found = routes(data, now=NOW, max_age=MAX_AGE)
        assert found.default == BASELINE and found.overrides == {}
        assert why in found.why

    def test_a_state_canaryd_hands_over_needs_no_confirmation(self) -> None:
        """The hook's CANARYD_SWITCH_JSON has no `confirmed_at` and is current."""
        found = routes(state(confirmed_at=None), now=NOW, max_age=MAX_AGE, delivered=True)
        assert found.default == SPECULATIVE


class TestRenderMap:
    def test_the_map_keys_on_the_header_and_names_the_generation(self) -> None:
        """One `map` block: default upstream, a quoted line per category sent elsewhere."""
        text = render_map(Routes(SPECULATIVE, "speculation on except code", 7, {"code": BASELINE}))
        assert "map $http_x_canaryd_category $canaryd_upstream {" in text
        assert "    default speculative;\n" in text and '    "code" baseline;\n' in text
        assert map_generation(text) == 7
        assert header_variable("X-Traffic-Class") == "$http_x_traffic_class"

    def test_a_reason_with_newlines_stays_one_comment_line(self) -> None:
        """A switch reason cannot inject nginx directives into the map."""
        text = render_map(Routes(BASELINE, "switch off: a\n}\nserver { listen 80; }", 2))
        assert all(line.startswith(("#", "map ", "    ", "}")) for line in text.splitlines()), text
        assert text.count("}") - text.split("\n", 2)[1].count("}") == 1

    def test_a_category_name_nginx_cannot_take_is_left_to_the_default(self) -> None:
        """A name with a quote is not quoted wrongly: it is listed in a comment instead."""
        text = render_map(Routes(SPECULATIVE, "on", 3, {'bad"name': BASELINE}))
        assert '"bad' not in text.split("}")[0]
        assert "left to the default" in text

    def test_an_upstream_name_that_is_no_nginx_name_is_refused(self) -> None:
        """Option values end up in the config: they must be plain names."""
        with pytest.raises(ValueError, match="must match"):
            render_map(Routes(SPECULATIVE, "on", 1), baseline_upstream="a; b")


class TestMapKeywords:
    KEYWORDS = ("default", "include", "hostnames", "volatile")

    def test_map_keywords_are_escaped_not_quoted(self) -> None:
        """nginx reads `default`, `include`, `hostnames` and `volatile` as map parameters
        even quoted; as categories they are backslash-escaped source values."""
        overrides = {name: BASELINE for name in self.KEYWORDS} | {"code": BASELINE}
        text = render_map(Routes(SPECULATIVE, "on except these", 4, overrides))
        for name in self.KEYWORDS:
            assert f"    \\{name} baseline;\n" in text
            assert f'"{name}"' not in text
        assert '    "code" baseline;\n' in text

    def test_real_nginx_takes_the_map_and_routes_a_category_named_default(
        self, tmp_path: Path
    ) -> None:
        """`nginx -t` passes with categories named like map keywords, and a request of the
        category `default` goes to the baseline while the default stays speculative."""
        from tests.support.nginx import Nginx

        overrides = {name: BASELINE for name in self.KEYWORDS}
        map_file = tmp_path / "canaryd-map.conf"
        map_file.write_text(render_map(Routes(SPECULATIVE, "on", 5, overrides)))
        server = Nginx.start(
            tmp_path / "nginx",
            f"include {map_file};\n"
            "server { listen 127.0.0.1:{port}; location / { return 200 $canaryd_upstream; } }",
        )
        try:
            for category, upstream in (
                ("default", BASELINE),
                ("include", BASELINE),
                ("qa", SPECULATIVE),
            ):
                answer = httpx.get(server.url, headers={"X-Canaryd-Category": category})
                assert answer.text == upstream, category
        finally:
            server.stop()


class TestWriteMap:
    def test_the_message_is_one_line_whatever_the_reason(self, tmp_path: Path) -> None:
        """What `canaryd switch nginx-map` prints stays one line for a reason with newlines."""
        found = Routes(BASELINE, "switch off: a\nb\r\nc", 2)
        done = write_map(tmp_path / "map.conf", render_map(found), found)
        assert "\n" not in done.message and "\r" not in done.message
        assert "a b c" in done.message

    def test_an_unchanged_route_is_not_rewritten_nor_reloaded(self, tmp_path: Path) -> None:
        """A new generation that routes the same needs no reload."""
        path = tmp_path / "routes.conf"
        marker = tmp_path / "reloads"
        reload = f"{sys.executable} -c \"open({str(marker)!r}, 'a').write('x')\""
        first = Routes(SPECULATIVE, "on", 3)
        assert write_map(path, render_map(first), first, reload).reloaded
        again = Routes(SPECULATIVE, "on", 4)
        done = write_map(path, render_map(again), again, reload)
        assert not done.written and "unchanged" in done.message
        assert marker.read_text() == "x"

    def test_an_older_generation_never_turns_speculation_back_on(self, tmp_path: Path) -> None:
        """Generation 5 off, then a late generation 4 on: the file keeps 5; a late 'off'
        is still applied (the safe side)."""
        path = tmp_path / "routes.conf"
        off = Routes(BASELINE, "off", 5)
        write_map(path, render_map(off), off)
        late_on = Routes(SPECULATIVE, "on", 4)
        done = write_map(path, render_map(late_on), late_on)
        assert not done.written and "older" in done.message
        assert map_generation(path.read_text()) == 5

    def test_a_failed_reload_puts_the_old_map_back(self, tmp_path: Path) -> None:
        """The file keeps saying what nginx routes by, so the next run reloads again."""
        path = tmp_path / "routes.conf"
        off = Routes(BASELINE, "off", 1)
        write_map(path, render_map(off), off)
        on = Routes(SPECULATIVE, "on", 2)
        failing = f"{sys.executable} -c 'import sys; sys.exit(\"nginx: no pid\")'"
        with pytest.raises(RuntimeError, match="exited with 1: 'nginx: no pid'"):
            write_map(path, render_map(on), on, failing)
        assert path.read_text() == render_map(off)
        assert write_map(path, render_map(on), on).written
