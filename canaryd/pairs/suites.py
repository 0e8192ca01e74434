"""Prompt suites: reading, validating and selecting the prompts canaryd sends to both arms.

A suite is one JSON Lines file. Two formats are understood and told apart per file: the
native format (one `Prompt` per line, see docs/prompts.md) and the FastChat / MT-Bench /
Spec-Bench `question.jsonl` format (`question_id`, `category`, `turns`). Validation never
stops at the first problem: every problem is reported as ``file:line: reason`` so that a
person can fix a file in one pass, and loading refuses a file with any problem at all.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast, get_args

from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from canaryd.errors import PromptFileError, UnknownCategoryError
from canaryd.paths import prompts_dir
from engine.types import Message, Role
from gates.records import Check, CheckKind, Prompt

__all__ = [
    "CATEGORY_PATTERN",
    "DEFAULT_MTBENCH_MAX_TOKENS",
    "MAX_TOKENS_LIMIT",
    "Suite",
    "load_default_suites",
    "load_suite",
    "load_suites",
    "sanitise_category",
    "select",
    "suite_files",
    "validate_path",
]

# Categories become Prometheus label values, so they are short, lower-case identifiers.
CATEGORY_PATTERN: Final = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
MAX_TOKENS_LIMIT: Final = 8192
DEFAULT_MTBENCH_MAX_TOKENS: Final = 128

_NATIVE_REQUIRED: Final = ("id", "category", "messages", "max_tokens")
_NATIVE_KEYS: Final = frozenset({*_NATIVE_REQUIRED, "reference", "check"})
_MESSAGE_KEYS: Final = ("role", "content")
_CHECK_KEYS: Final = frozenset({"kind", "value", "tolerance"})
_MTBENCH_REQUIRED: Final = ("question_id", "category", "turns")
_MTBENCH_KEYS: Final = frozenset({*_MTBENCH_REQUIRED, "reference"})
_ROLES: Final[tuple[str, ...]] = get_args(Role)
_CHECK_KINDS: Final[tuple[str, ...]] = get_args(CheckKind)


@dataclass(frozen=True, slots=True)
class _TurnReference:
    """What a question file says about the answer to one turn."""

    text: str | None = None
    check: Check | None = None


_NO_REFERENCE: Final = _TurnReference()


@dataclass(frozen=True, slots=True)
class Suite:
    """The prompts of one suite file; `sha256` identifies the exact file content run."""

    name: str
    path: Path
    prompts: tuple[Prompt, ...]
    sha256: str

    @property
    def categories(self) -> list[str]:
        return sorted({prompt.category for prompt in self.prompts})

    def by_category(self, category: str) -> list[Prompt]:
        return [prompt for prompt in self.prompts if prompt.category == category]


def sanitise_category(raw: str) -> str:
    """Map a free-form category ("Math Reasoning") to a bounded label ("math_reasoning")."""
    label = re.sub(r"[^a-z0-9]+", "_", raw.strip().lower()).strip("_")
    label = re.sub(r"^[^a-z]+", "", label)[:32].rstrip("_")
    return label or "uncategorised"


def suite_files(path: Path) -> list[Path]:
    """A directory stands for every `*.jsonl` directly inside it, in name order."""
    if path.is_dir():
        return sorted(child for child in path.glob("*.jsonl") if child.is_file())
    return [path]


def validate_path(path: Path) -> list[str]:
    """Every problem in a suite file (or in each suite file of a directory); [] when valid."""
    if not path.exists():
        return [f"{path}: no such file or directory"]
    files = suite_files(path)
    if not files:
        return [f"{path}: no *.jsonl suite files in this directory"]
    problems: list[str] = []
    for file in files:
        problems.extend(_parse_file(file, DEFAULT_MTBENCH_MAX_TOKENS)[1])
    return problems


def load_suite(path: Path, *, mtbench_max_tokens: int = DEFAULT_MTBENCH_MAX_TOKENS) -> Suite:
    """Load one suite file, native or MT-Bench format; raise `PromptFileError` if invalid.

    `mtbench_max_tokens` is the generation budget of imported MT-Bench questions, which
    carry none of their own.
    """
    if not path.is_file():
        reason = "is a directory, not a suite file" if path.is_dir() else "no such file"
        raise PromptFileError([f"{path}: {reason}"])
    prompts, problems = _parse_file(path, mtbench_max_tokens)
    if problems:
        raise PromptFileError(problems)
    return Suite(
        name=path.stem,
        path=path,
        prompts=tuple(prompts),
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
    )


def load_suites(
    paths: Sequence[Path], *, mtbench_max_tokens: int = DEFAULT_MTBENCH_MAX_TOKENS
) -> list[Suite]:
    """Load every suite named (a directory means its `*.jsonl` files), all or nothing.

    Problems of every file are collected before raising, and a prompt id may appear in
    only one suite: records and the store know a prompt by its id.
    """
    problems: list[str] = []
    suites: list[Suite] = []
    for path in paths:
        if not path.exists():
            problems.append(f"{path}: no such file or directory")
            continue
        files = suite_files(path)
        if not files:
            problems.append(f"{path}: no *.jsonl suite files in this directory")
        for file in files:
            try:
                suites.append(load_suite(file, mtbench_max_tokens=mtbench_max_tokens))
            except PromptFileError as exc:
                problems.extend(exc.problems)
    problems.extend(_duplicates_across(suites))
    if problems:
        raise PromptFileError(problems)
    return suites


def load_default_suites() -> list[Suite]:
    """The suites shipped with canaryd (`prompts/`)."""
    return load_suites([prompts_dir()])


def select(suites: Iterable[Suite], category: str | None) -> list[Prompt]:
    """All prompts of the suites, or those of one category (which must exist)."""
    suites = list(suites)
    prompts = [prompt for suite in suites for prompt in suite.prompts]
    if category is None:
        return prompts
    chosen = [prompt for prompt in prompts if prompt.category == category]
    if not chosen:
        known = sorted({prompt.category for prompt in prompts})
        raise UnknownCategoryError(category, known)
    return chosen


def _duplicates_across(suites: Sequence[Suite]) -> list[str]:
    first_seen: dict[str, str] = {}
    problems: list[str] = []
    for suite in suites:
        for prompt in suite.prompts:
            if prompt.id in first_seen:
                problems.append(
                    f"{prompt.source}: duplicate id {prompt.id!r} "
                    f"(first defined at {first_seen[prompt.id]})"
                )
            else:
                first_seen[prompt.id] = prompt.source
    return problems


class _FileParser:
    """Parses one file line by line, collecting prompts and every problem found."""

    def __init__(self, path: Path, mtbench_max_tokens: int) -> None:
        self.path = path
        self.mtbench_max_tokens = mtbench_max_tokens
        self.prompts: list[Prompt] = []
        self.problems: list[str] = []
        self.first_line_of_id: dict[str, int] = {}
        self.line = 0

    def problem(self, reason: str, line: int | None = None) -> None:
        self.problems.append(f"{self.path}:{self.line if line is None else line}: {reason}")

    def parse(self, text: str) -> None:
        records: list[tuple[int, dict[str, Any]]] = []
        for number, raw in enumerate(text.splitlines(), start=1):
            self.line = number
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except json.JSONDecodeError as exc:
                self.problem(f"invalid JSON: {exc.msg} (column {exc.colno})")
                continue
            if not isinstance(record, dict):
                self.problem(f"not a JSON object but {_json_type(record)}")
                continue
            unstorable = _unstorable_text(record)
            if unstorable is not None:
                self.problem(unstorable)
                continue
            records.append((number, record))
        if not text.strip():
            self.problem("empty file: no prompts", line=1)
            return
        # The first object decides the format of the whole file: a file mixing both is a
        # mistake, and is reported as unknown keys on the lines of the other format.
        mtbench = bool(records) and _looks_like_mtbench(records[0][1])
        for number, record in records:
            self.line = number
            if mtbench:
                self.parse_mtbench(record)
            else:
                self.parse_native(record)

    def keys_ok(
        self,
        record: dict[str, Any],
        required: Sequence[str],
        known: frozenset[str],
        where: str = "",
    ) -> bool:
        ok = True
        for key in sorted(set(record) - known):
            self.problem(f"unknown key {where + key!r}")
            ok = False
        for key in required:
            if key not in record:
                self.problem(f"missing key {where + key!r}")
                ok = False
        return ok

    def claim_id(self, prompt_id: str) -> bool:
        if prompt_id in self.first_line_of_id:
            first = self.first_line_of_id[prompt_id]
            self.problem(f"duplicate id {prompt_id!r} (first defined at line {first})")
            return False
        self.first_line_of_id[prompt_id] = self.line
        return True

    # -- native format ---------------------------------------------------------------

    def parse_native(self, record: dict[str, Any]) -> None:
        ok = self.keys_ok(record, _NATIVE_REQUIRED, _NATIVE_KEYS)
        prompt_id = record.get("id")
        if "id" in record:
            if not isinstance(prompt_id, str) or not prompt_id.strip():
                self.problem("id must be a non-empty string")
                ok = False
            elif not self.claim_id(prompt_id):
                ok = False
        category = record.get("category")
        if "category" in record and not (
            isinstance(category, str) and CATEGORY_PATTERN.match(category)
        ):
            self.problem(
                f"category {category!r} must match {CATEGORY_PATTERN.pattern} "
                "(it becomes a metric label)"
            )
            ok = False
        messages = self.messages(record["messages"]) if "messages" in record else None
        max_tokens = record.get("max_tokens")
        if "max_tokens" in record and not _is_max_tokens(max_tokens):
            self.problem(
                f"max_tokens must be an integer in 1..{MAX_TOKENS_LIMIT}, not {max_tokens!r}"
            )
            ok = False
        reference = record.get("reference")
        if reference is not None and not (isinstance(reference, str) and reference.strip()):
            self.problem("reference must be a non-empty string")
            ok = False
        check = self.check(record["check"]) if record.get("check") is not None else None
        if record.get("check") is not None and check is None:
            ok = False
        if not ok or messages is None:
            return
        self.prompts.append(
            Prompt(
                id=cast(str, prompt_id),
                category=cast(str, category),
                messages=messages,
                max_tokens=cast(int, max_tokens),
                reference=reference,
                check=check,
                suite=self.path.stem,
                source=f"{self.path}:{self.line}",
            )
        )

    def messages(self, raw: Any) -> tuple[Message, ...] | None:
        if not isinstance(raw, list):
            self.problem(f"messages must be a list, not {_json_type(raw)}")
            return None
        if not raw:
            self.problem("messages is empty: a prompt needs at least one user message")
            return None
        messages: list[Message] = []
        ok = True
        for index, item in enumerate(raw):
            where = f"messages[{index}]"
            if not isinstance(item, dict):
                self.problem(f"{where} must be an object, not {_json_type(item)}")
                ok = False
                continue
            if not self.keys_ok(item, _MESSAGE_KEYS, frozenset(_MESSAGE_KEYS), f"{where}."):
                ok = False
                continue
            role, content = item["role"], item["content"]
            if role not in _ROLES:
                self.problem(f"{where}.role {role!r} is not one of {', '.join(_ROLES)}")
                ok = False
            if not isinstance(content, str) or not content.strip():
                self.problem(f"{where}.content is empty")
                ok = False
            if ok:
                messages.append(Message(role=role, content=content))
        last = raw[-1]
        if isinstance(last, dict) and last.get("role") in _ROLES and last["role"] != "user":
            self.problem(f"last message is from {last['role']!r}: it must be from the user")
            ok = False
        return tuple(messages) if ok else None

    def check(self, raw: Any) -> Check | None:
        if not isinstance(raw, dict):
            self.problem(f"check must be an object, not {_json_type(raw)}")
            return None
        if not self.keys_ok(raw, ("kind", "value"), _CHECK_KEYS, "check."):
            return None
        kind, value = raw["kind"], raw["value"]
        if kind not in _CHECK_KINDS:
            self.problem(f"check.kind {kind!r} is not one of {', '.join(_CHECK_KINDS)}")
            return None
        tolerance = raw.get("tolerance")
        if tolerance is not None and kind != "numeric":
            self.problem(f"check.tolerance applies to numeric checks only, not {kind!r}")
            return None
        if kind in ("exact", "contains"):
            if not isinstance(value, str) or not value.strip():
                self.problem(f"check.value of a {kind!r} check must be a non-empty string")
                return None
        elif kind == "regex":
            if not isinstance(value, str) or not value:
                self.problem("check.value of a 'regex' check must be a non-empty string")
                return None
            try:
                re.compile(value)
            except re.error as exc:
                self.problem(f"check.value: regex does not compile: {exc}")
                return None
        elif kind == "json_schema":
            if not isinstance(value, dict):
                self.problem(
                    f"check.value of a 'json_schema' check must be an object, "
                    f"not {_json_type(value)}"
                )
                return None
            try:
                validator_for(value).check_schema(value)
            except SchemaError as exc:
                self.problem(
                    f"check.value is not a valid JSON schema: at {exc.json_path}: {exc.message}"
                )
                return None
        else:  # numeric
            if not _is_number(value):
                self.problem(f"check.value of a 'numeric' check must be a number, not {value!r}")
                return None
            if tolerance is not None and not (_is_number(tolerance) and tolerance >= 0):
                self.problem(f"check.tolerance must be a number >= 0, not {tolerance!r}")
                return None
            value = float(value)
        if tolerance is None:
            return Check(kind=kind, value=value)
        return Check(kind=kind, value=value, tolerance=float(tolerance))

    # -- FastChat / MT-Bench question.jsonl --------------------------------------------

    def parse_mtbench(self, record: dict[str, Any]) -> None:
        ok = self.keys_ok(record, _MTBENCH_REQUIRED, _MTBENCH_KEYS)
        question_id = record.get("question_id")
        if "question_id" in record and not (
            (isinstance(question_id, int) and not isinstance(question_id, bool))
            or (isinstance(question_id, str) and question_id.strip())
        ):
            self.problem("question_id must be an integer or a non-empty string")
            ok = False
        elif "question_id" in record and not self.claim_id(f"mtbench-{question_id}"):
            ok = False
        category = record.get("category")
        if "category" in record and not isinstance(category, str):
            self.problem("category must be a string")
            ok = False
        turns = record.get("turns")
        if "turns" in record and not _is_text_list(turns):
            self.problem("turns must be a non-empty list of non-empty strings")
            ok = False
        answers = self.mtbench_references(record["reference"]) if "reference" in record else []
        if not ok or answers is None:
            return
        base_id = f"mtbench-{question_id}"
        label = sanitise_category(cast(str, category))
        turns = cast(list[str], turns)
        first = answers[0] if answers else _NO_REFERENCE
        second = answers[1] if len(answers) > 1 else _NO_REFERENCE
        source = f"{self.path}:{self.line}"
        self.prompts.append(
            Prompt(
                id=base_id,
                category=label,
                messages=(Message("user", turns[0]),),
                max_tokens=self.mtbench_max_tokens,
                reference=first.text,
                check=first.check,
                suite=self.path.stem,
                source=source,
            )
        )
        # The second turn needs a first answer to condition on; only a reference gives one
        # that is the same on both arms and on every run.
        if first.text is not None and len(turns) > 1 and self.claim_id(f"{base_id}-t2"):
            self.prompts.append(
                Prompt(
                    id=f"{base_id}-t2",
                    category=label,
                    messages=(
                        Message("user", turns[0]),
                        Message("assistant", first.text),
                        Message("user", turns[1]),
                    ),
                    max_tokens=self.mtbench_max_tokens,
                    reference=second.text,
                    check=second.check,
                    suite=self.path.stem,
                    source=source,
                )
            )

    def mtbench_references(self, raw: Any) -> list[_TurnReference] | None:
        """The reference of each turn.

        Public question files write a turn without a reference as "" and a turn with
        several acceptable answers as a list of strings; anything else is a mistake.
        """
        if not isinstance(raw, list):
            self.problem(f"reference must be a list (one entry per turn), not {_json_type(raw)}")
            return None
        answers: list[_TurnReference] = []
        ok = True
        for index, entry in enumerate(raw):
            if isinstance(entry, str):
                answers.append(_TurnReference(entry) if entry.strip() else _NO_REFERENCE)
            elif isinstance(entry, list) and all(isinstance(item, str) for item in entry):
                answers.append(_any_of([item for item in entry if item.strip()]))
            else:
                self.problem(
                    f"reference[{index}] must be a string or a list of strings, "
                    f"not {_json_type(entry)}"
                )
                ok = False
        return answers if ok else None


def _parse_file(path: Path, mtbench_max_tokens: int) -> tuple[list[Prompt], list[str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        return [], [f"{path}:1: not UTF-8 text: {exc.reason} at byte {exc.start}"]
    except OSError as exc:
        return [], [f"{path}: cannot read: {exc.strerror or exc}"]
    parser = _FileParser(path, mtbench_max_tokens)
    parser.parse(text)
    return parser.prompts, parser.problems


def _unstorable_text(value: Any) -> str | None:
    """Why a string in `value` cannot be sent and stored as text (a NUL character, which
    PostgreSQL refuses; a lone surrogate, which is not Unicode text); None when none is."""
    if isinstance(value, str):
        if "\x00" in value:
            return "a NUL character (\\u0000) in the text: remove it"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return (
                f"a lone surrogate ({value[exc.start : exc.end]!a}) in the text: not Unicode "
                "text; encode the character as a proper pair or remove it"
            )
        return None
    items = value.items() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for item in items:
        for part in item if isinstance(value, dict) else (item,):
            problem = _unstorable_text(part)
            if problem is not None:
                return problem
    return None


def _looks_like_mtbench(record: dict[str, Any]) -> bool:
    return "messages" not in record and ("question_id" in record or "turns" in record)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _is_number(value: Any) -> bool:
    # Python's json accepts NaN and Infinity, which no tolerance can compare against.
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_max_tokens(value: Any) -> bool:
    return (
        isinstance(value, int) and not isinstance(value, bool) and (1 <= value <= MAX_TOKENS_LIMIT)
    )


def _any_of(answers: list[str]) -> _TurnReference:
    """A list of acceptable answers: the task score is a pass when the output contains
    any of them (case-insensitively, any whitespace between words), where a single
    string reference is scored by similarity. The first answer is the reference text."""
    if not answers:
        return _NO_REFERENCE
    alternatives = (r"\s+".join(re.escape(word) for word in answer.split()) for answer in answers)
    return _TurnReference(
        answers[0], Check(kind="regex", value=f"(?i)(?:{'|'.join(alternatives)})")
    )


def _is_text_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(item, str) and item.strip() for item in value)
    )
