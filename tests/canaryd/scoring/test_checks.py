"""Each `Check` kind, with answers that pass and answers that fail."""

from __future__ import annotations

import time
from typing import Any

import jsonschema
import pytest

from canaryd.scoring import evaluate_check, extract_json, last_number, normalise_answer
from canaryd.scoring.checks import REGEX_TIMEOUT_S
from gates.records import Check


class TestNormaliseAnswer:
    def test_normalises(self) -> None:
        """Whitespace, case, surrounding quotes and trailing periods do not matter."""
        assert normalise_answer('  "The   Eiffel\nTower."  ') == "the eiffel tower"


class TestExactCheck:
    @pytest.mark.parametrize("text", ["Paris", " paris. ", '"PARIS"', "'Paris.'", "Paris。"])
    def test_passes(self, text: str) -> None:
        """Answers equal to the value after normalisation pass."""
        assert evaluate_check(Check("exact", "Paris"), text)

    @pytest.mark.parametrize("text", ["Paris, France", "The answer is Paris.", "", "Pariss"])
    def test_fails(self, text: str) -> None:
        """Anything more or less than the value fails."""
        assert not evaluate_check(Check("exact", "Paris"), text)


class TestContainsCheck:
    def test_passes_case_insensitively(self) -> None:
        """The value may appear anywhere, in any case."""
        assert evaluate_check(Check("contains", "photosynthesis"), "It is PhotoSynthesis.")

    def test_fails_when_absent(self) -> None:
        """An answer without the value fails."""
        assert not evaluate_check(Check("contains", "photosynthesis"), "It is respiration.")


class TestRegexCheck:
    def test_matches_anywhere(self) -> None:
        """The pattern is searched, not anchored at the start."""
        assert evaluate_check(Check("regex", r"\bdef \w+\("), "Here:\ndef add(a, b):")

    def test_multiline_anchors(self) -> None:
        """^ and $ match at line boundaries."""
        assert evaluate_check(Check("regex", r"^return$"), "x\nreturn\ny")

    def test_dot_matches_newline(self) -> None:
        """. spans lines."""
        assert evaluate_check(Check("regex", r"begin.*end"), "begin\nmiddle\nend")

    def test_fails(self) -> None:
        """No match fails."""
        assert not evaluate_check(Check("regex", r"\d{4}"), "in the year twenty")

    @pytest.mark.timeout(30)
    def test_catastrophic_backtracking_fails_the_answer_within_the_limit(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A pattern that backtracks exponentially on an answer (minutes to centuries with
        a backtracking engine) fails that answer after `REGEX_TIMEOUT_S`, logged, instead
        of wedging the pair cycle."""
        started = time.monotonic()
        assert not evaluate_check(Check("regex", r"(a|aa)+$"), "a" * 80 + "!")
        assert time.monotonic() - started < REGEX_TIMEOUT_S + 4
        assert "check.timed_out" in capsys.readouterr().out

    def test_same_pattern_still_passes_a_matching_answer(self) -> None:
        """The time limit changes nothing for answers the pattern decides quickly."""
        assert evaluate_check(Check("regex", r"(a|aa)+$"), "b" + "a" * 80)

    def test_pattern_that_does_not_compile_is_the_suites_bug(self) -> None:
        """A broken pattern raises ValueError naming it (suites are validated at load)."""
        with pytest.raises(ValueError, match="does not compile"):
            evaluate_check(Check("regex", r"(unclosed"), "x")


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


class TestJsonSchemaCheck:
    @pytest.mark.parametrize(
        "text",
        [
            '{"name": "Ada", "age": 36}',
            'Sure! Here it is: {"name": "Ada", "age": 36} Hope that helps.',
            'See [1].\n```json\n{"name": "Ada", "age": 36}\n```',
            '```\n{"name": "Ada", "age": 36}\n```',
        ],
    )
    def test_passes(self, text: str) -> None:
        """The first JSON object, bare or fenced, validates."""
        assert evaluate_check(Check("json_schema", SCHEMA), text)

    @pytest.mark.parametrize(
        "text",
        [
            '{"name": "Ada"}',
            '{"name": "Ada", "age": "36"}',
            "name: Ada, age: 36",
            '{"name": "Ada", "age": 36',
            "",
        ],
    )
    def test_fails(self, text: str) -> None:
        """Invalid, incomplete or absent JSON fails."""
        assert not evaluate_check(Check("json_schema", SCHEMA), text)

    def test_array(self) -> None:
        """A top-level array is found and validated too."""
        check = Check("json_schema", {"type": "array", "items": {"type": "integer"}})
        assert evaluate_check(check, "The primes: [2, 3, 5, 7].")
        assert not evaluate_check(check, 'The primes: ["two", 3].')

    def test_extract_json_reports_absence(self) -> None:
        """Text without JSON reports not found rather than a null value."""
        assert extract_json("no json {here") == (False, None)
        assert extract_json("value: null") == (False, None)

    def test_broken_schema_raises(self) -> None:
        """A schema that is itself invalid is a suite bug and raises."""
        with pytest.raises(jsonschema.SchemaError):
            evaluate_check(Check("json_schema", {"type": "no-such-type"}), "{}")


class TestNumericCheck:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("The answer is 42.", 42.0),
            ("First 3, then 7, so 10", 10.0),
            ("It costs $1,200.", 1200.0),
            ("A loss of -$1,200.50", -1200.5),
            ("x = -3.25", -3.25),
            ("Three quarters: 3/4", 0.75),
            ("about 2.5e3 units", 2500.0),
            ("1,234,567 people", 1234567.0),
            ("we get .5", 0.5),
            ("from 5-3", 3.0),
            ("−7 degrees", -7.0),
        ],
    )
    def test_last_number(self, text: str, expected: float) -> None:
        """The last number is parsed with its sign, separators and fraction."""
        assert last_number(text) == pytest.approx(expected)

    def test_no_number(self) -> None:
        """Text without digits has no number."""
        assert last_number("no digits here, v. $") is None

    def test_passes_within_default_tolerance(self) -> None:
        """A value within 1e-6 passes."""
        assert evaluate_check(Check("numeric", 0.75), "so 3/4")
        assert evaluate_check(Check("numeric", 1200), "Total: $1,200")

    def test_fails_outside_tolerance(self) -> None:
        """A different last number fails even if the right one appears earlier."""
        assert not evaluate_check(Check("numeric", 42), "42? No: 43")
        assert not evaluate_check(Check("numeric", 0.75), "0.7500011")

    def test_custom_tolerance(self) -> None:
        """A check's own absolute tolerance widens the band."""
        assert evaluate_check(Check("numeric", 3.14, tolerance=0.01), "pi is about 3.1416")

    def test_relative_tolerance_for_large_values(self) -> None:
        """Large values compare within 1e-9 relative, beyond the absolute tolerance."""
        assert evaluate_check(Check("numeric", 1e15), "1,000,000,000,000,000.3")
        assert not evaluate_check(Check("numeric", 1e15), "1,000,000,100,000,000")

    def test_no_number_fails(self) -> None:
        """An answer without a number fails."""
        assert not evaluate_check(Check("numeric", 0), "none")


class TestEvaluateCheck:
    def test_unknown_kind_raises(self) -> None:
        """A kind outside the contract raises ValueError naming it."""
        with pytest.raises(ValueError, match="'fuzzy'"):
            evaluate_check(Check("fuzzy", "x"), "x")  # type: ignore[arg-type]
