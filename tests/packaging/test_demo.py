"""`make demo`'s first table: the demo suite it runs (`prompts/demo`) holds one short prompt
per category with a small output cap, so the table comes in a minute or two on a CPU with
the embedded model; the Makefile runs one pair per prompt of it, and the daemon that follows
(and every other command) keeps the shipped suites."""

from __future__ import annotations

import re
from pathlib import Path

from canaryd.config import Settings
from canaryd.pairs.plan import suite_sampler
from canaryd.pairs.suites import load_default_suites, load_suites, validate_path

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "prompts" / "demo"
# Tokens per arm and characters of prompt: what keeps a pair to seconds on two busy cores.
MAX_TOKENS = 16
MAX_PROMPT_CHARS = 400


def demo_recipe() -> str:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    match = re.search(r"^demo:.*?\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert match, "no demo target in the Makefile"
    return match.group(1)


class TestDemoSuite:
    def test_short_prompts_one_per_category(self) -> None:
        """The demo suite is valid, one prompt per category, each capped at 16 tokens and
        a few hundred characters of prompt."""
        assert validate_path(DEMO) == []
        prompts = [p for suite in load_suites([DEMO]) for p in suite.prompts]
        categories = [p.category for p in prompts]
        assert len(categories) == len(set(categories)) >= 5
        for prompt in prompts:
            assert prompt.max_tokens <= MAX_TOKENS, prompt.id
            chars = sum(len(message.content) for message in prompt.messages)
            assert chars <= MAX_PROMPT_CHARS, prompt.id

    def test_not_among_the_shipped_suites(self) -> None:
        """The daemon's default suites do not include the demo's prompts, and the two load
        together (no id is in both)."""
        shipped = {p.id for suite in load_default_suites() for p in suite.prompts}
        demo = {p.id for suite in load_suites([DEMO]) for p in suite.prompts}
        assert shipped.isdisjoint(demo)
        assert load_suites([REPO / "prompts", DEMO])


class TestDemoRecipe:
    def test_once_runs_each_demo_prompt_once(self) -> None:
        """`make demo` runs `canaryd once` on prompts/demo with as many pairs as it has
        prompts, which the stratified sampler spreads one per category; `canaryd run`
        follows without the demo suite."""
        recipe = demo_recipe()
        once = re.search(
            r"CANARYD_PROMPTS__SUITES='\[\"\$\(DEMO_SUITE\)\"\]' "
            r"\$\(BIN\)/canaryd once --pairs (\d+)",
            recipe,
        )
        assert once, recipe
        assert "DEMO_SUITE := prompts/demo" in (REPO / "Makefile").read_text(encoding="utf-8")
        settings = Settings(prompts={"suites": [DEMO]})
        prompts = load_suites([DEMO])[0].prompts
        assert int(once.group(1)) == len(prompts)
        chosen = suite_sampler(settings).take(len(prompts))
        assert sorted(p.id for p in chosen) == sorted(p.id for p in prompts)
        run_line = recipe.strip().splitlines()[-1]
        assert run_line.endswith("$(BIN)/canaryd run") and "PROMPTS" not in run_line
