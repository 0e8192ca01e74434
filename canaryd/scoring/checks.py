"""Deciding whether an answer passes a prompt's `Check`.

Each kind reads the answer the way a grader would: `exact` after normalisation,
`contains` case-insensitively, `regex` anywhere, `json_schema` on the first JSON
value in the text (fenced or not), `numeric` on the last number in the text. A `regex`
check runs on the `regex` engine with a time limit (`REGEX_TIMEOUT_S`): a pattern that
backtracks catastrophically on a model's output fails that answer, logged, instead of
wedging the pair cycle.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache
from typing import Any

import jsonschema
import regex
import structlog

from gates.records import Check

log = structlog.get_logger(__name__)

# Relative tolerance applied on top of a check's absolute `tolerance`, so that large
# values survive float round-off (1e15 parsed from "1,000,000,000,000,000").
NUMERIC_RELATIVE_TOLERANCE = 1e-9
# A grader's pattern matches a few kilobytes in microseconds; a second means it is
# backtracking without end, and the cycle (and the watchdog) must not wait for it.
REGEX_TIMEOUT_S = 1.0

_WHITESPACE = re.compile(r"\s+")
_QUOTES = "\"'`“”‘’«»「」『』"
_TRAILING_PERIODS = ".。"


def normalise_answer(text: str) -> str:
    """Strip, casefold, collapse whitespace, drop surrounding quotes and trailing periods."""
    normalised = _WHITESPACE.sub(" ", text.casefold()).strip()
    while True:
        stripped = normalised.rstrip(_TRAILING_PERIODS).strip(_QUOTES).strip()
        if stripped == normalised:
            return normalised
        normalised = stripped


# ---- JSON -----------------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*(?:json[ \t]*)?\n(.*?)```", re.DOTALL | re.IGNORECASE)
_JSON_START = re.compile(r"[{\[]")
_DECODER = json.JSONDecoder()


def _first_json_in(text: str) -> tuple[bool, Any]:
    for start in _JSON_START.finditer(text):
        try:
            value, _ = _DECODER.raw_decode(text, start.start())
        except json.JSONDecodeError:
            continue
        return True, value
    return False, None


def extract_json(text: str) -> tuple[bool, Any]:
    """(found, value): the first JSON object or array in `text`.

    A fenced block (```json … ``` or ``` … ```) is searched first, because models put
    their answer there and the prose around it may contain brackets ("see [1]").
    """
    for fence in _FENCE.finditer(text):
        found, value = _first_json_in(fence.group(1))
        if found:
            return True, value
    return _first_json_in(text)


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    schema = json.loads(schema_json)
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)  # a broken schema is the suite's bug: raise
    return validator_class(schema)


def matches_json_schema(schema: dict[str, Any], text: str) -> bool:
    """Whether the first JSON value in `text` validates against `schema` (no JSON: False)."""
    found, value = extract_json(text)
    if not found:
        return False
    return bool(_validator(json.dumps(schema, sort_keys=True)).is_valid(value))


# ---- numbers --------------------------------------------------------------------------

_NUMBER = re.compile(
    r"""
    (?<![\w.])                          # not inside a word or after a decimal point
    (?P<sign>[-−])?                     # ASCII hyphen-minus or U+2212 minus
    \$?
    (?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)?  # integer part, commas as thousands separators
    (?:\.(?P<frac>\d+))?
    (?:[eE](?P<exp>[-+]?\d+))?
    (?:\s*/\s*(?P<den>\d+)(?![\d,.]))?  # a fraction: 3/4
    """,
    re.VERBOSE,
)


def _parse_number(match: re.Match[str]) -> float | None:
    if match.group("int") is None and match.group("frac") is None:
        return None  # the pattern matched only a sign or a "$"
    integer = (match.group("int") or "0").replace(",", "")
    literal = f"{integer}.{match.group('frac') or '0'}"
    if match.group("exp") is not None:
        literal += f"e{match.group('exp')}"
    value = float(literal)
    if match.group("den") is not None:
        denominator = int(match.group("den"))
        if denominator == 0:
            return None
        value = float(Fraction(literal) / denominator)
    return -value if match.group("sign") else value


def last_number(text: str) -> float | None:
    """The last number written in `text` ("-$1,200.50", "3/4", "2.5e3"), or None."""
    last: float | None = None
    for match in _NUMBER.finditer(text):
        value = _parse_number(match)
        if value is not None:
            last = value
    return last


def numbers_close(answer: float, expected: float, tolerance: float) -> bool:
    """Within `tolerance` absolute, or within `NUMERIC_RELATIVE_TOLERANCE` relative."""
    return math.isclose(answer, expected, abs_tol=tolerance, rel_tol=NUMERIC_RELATIVE_TOLERANCE)


# ---- dispatch -------------------------------------------------------------------------


def _exact(check: Check, text: str) -> bool:
    return normalise_answer(text) == normalise_answer(str(check.value))


def _contains(check: Check, text: str) -> bool:
    return str(check.value).casefold() in text.casefold()


@lru_cache(maxsize=256)
def _pattern(pattern: str) -> Any:
    try:
        return regex.compile(pattern, regex.DOTALL | regex.MULTILINE)
    except regex.error as exc:
        raise ValueError(f"regex check pattern {pattern!r} does not compile: {exc}") from None


def _regex(check: Check, text: str) -> bool:
    pattern = _pattern(str(check.value))
    try:
        return pattern.search(text, timeout=REGEX_TIMEOUT_S) is not None
    except TimeoutError:
        log.warning(
            "check.timed_out",
            pattern=pattern.pattern[:200],
            text_chars=len(text),
            limit_s=REGEX_TIMEOUT_S,
            reason="the pattern backtracks without end on this answer; the answer fails",
        )
        return False


def _json_schema(check: Check, text: str) -> bool:
    return matches_json_schema(check.value, text)


def _numeric(check: Check, text: str) -> bool:
    answer = last_number(text)
    return answer is not None and numbers_close(answer, float(check.value), check.tolerance)


_CHECKS: dict[str, Callable[[Check, str], bool]] = {
    "exact": _exact,
    "contains": _contains,
    "regex": _regex,
    "json_schema": _json_schema,
    "numeric": _numeric,
}


def evaluate_check(check: Check, text: str) -> bool:
    """Whether `text` passes `check` (see `Check` for what each kind means)."""
    try:
        evaluate = _CHECKS[check.kind]
    except KeyError:
        raise ValueError(f"unknown check kind {check.kind!r}") from None
    return evaluate(check, text)
