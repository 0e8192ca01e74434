"""The configuration reference, generated from the `Settings` model itself.

`config_reference()` walks every section of `Settings` (and, for the arms, every engine
`kind` and the speculative sub-section) and renders one Markdown table per section: key,
type, default and description, as the pydantic fields declare them. docs/configuration.md
carries its output verbatim; a test keeps the two in step.
"""

from __future__ import annotations

import enum
import json
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from canaryd.config import Settings
from canaryd.telemetry.config import SeriesSpec, SignalMap, TelemetryArmConfig, TelemetryConfig
from engine.config import (
    FakeEngineConfig,
    OpenAIEngineConfig,
    SpeculativeConfig,
    TransformersEngineConfig,
)

__all__ = ["config_reference"]


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return " | ".join(json.dumps(arg) for arg in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(arg) for arg in get_args(annotation))
    if origin is tuple and get_args(annotation)[-1:] == (Ellipsis,):
        return f"list[{_type_name(get_args(annotation)[0])}]"  # a TOML array either way
    if origin is not None:
        args = ", ".join(_type_name(arg) for arg in get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(json.dumps(member.value) for member in annotation)
    if annotation is type(None):
        return "None"
    if annotation is Path:
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]  # no-argument factories
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    if value is None:
        return "unset"
    return f"`{json.dumps(value, default=str)}`"


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The model of a field that is a sub-section (`Model` or `Model | None`), else None."""
    candidates = (
        get_args(annotation)
        if get_origin(annotation) in (Union, types.UnionType)
        else (annotation,)
    )
    models = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
    others = [c for c in candidates if c is not type(None) and c not in models]
    return models[0] if len(models) == 1 and not others else None


def _table(
    prefix: str, model: type[BaseModel], title: str, *, flat: frozenset[str] = frozenset()
) -> list[str]:
    """The table of `model`'s keys, then one table per sub-section, depth first (the
    sub-sections named in `flat` get a row only)."""
    lines = [f"### `{prefix}`{title}", ""]
    doc = model.__dict__.get("__doc__")
    if doc:
        lines += [" ".join(doc.split()), ""]
    lines += ["| key | type | default | description |", "|---|---|---|---|"]
    subsections: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        sub = _section_model(field.annotation)
        if sub is not None and not (field.is_required() or field.default is None):
            subsections.append((name, sub))
            continue  # a section with defaults: its keys are in its own table
        lines.append(
            f"| `{prefix}.{name}` | {_cell(_type_name(field.annotation))} "
            f"| {_cell(_default(field))} | {_cell(field.description or '')} |"
        )
        if sub is not None and name not in flat:
            subsections.append((name, sub))
    lines.append("")
    for name, sub in subsections:
        lines += _table(f"{prefix}.{name}", sub, "")
    return lines


def _telemetry() -> list[str]:
    """`[telemetry]`, each arm's source, and the one shape every signal's series takes."""
    signals = ", ".join(f"`{name}`" for name in SignalMap.model_fields)
    return [
        *_table("telemetry", TelemetryConfig, ""),
        "`<arm>` is `baseline` or a speculative arm of `[arms]`. An arm without a table is",
        "not scraped; with none, telemetry is off and its gates are NODATA.",
        "",
        *_table("telemetry.arms.<arm>", TelemetryArmConfig, "", flat=frozenset({"signals"})),
        f"`<signal>` is one of {signals}.",
        "",
        *_table("telemetry.arms.<arm>.signals.<signal>", SeriesSpec, ""),
    ]


def config_reference() -> str:
    """Markdown: one table per section of `Settings`, in declaration order."""
    lines = [
        "Every key of `canaryd.toml`. Each can also be set in the environment as",
        "`CANARYD_<SECTION>__<KEY>` (for example `CANARYD_SCHEDULE__PAIR_INTERVAL_S=10`);",
        "the environment overrides the file.",
        "",
    ]
    for section, field in Settings.model_fields.items():
        if section == "arms":
            lines += [
                "`<arm>` is `baseline` or the name of a speculative arm (a lower-case letter,",
                "then up to 31 lower-case letters, digits or underscores); each arm is one",
                'engine, picked by `kind` (default `"transformers"`). Any number of',
                "speculative arms may be configured; every pair sends the same prompt to all",
                "arms, and `switch.arm` names the one the switch controls. Defaults: the",
                "baseline and one arm, `speculative`, both on the embedded model; the",
                "speculative arm adds `[arms.speculative.speculative]` (prompt lookup, 8",
                "draft tokens).",
                "",
            ]
            lines += _table("arms.<arm>", TransformersEngineConfig, ' with kind = "transformers"')
            lines += _table(
                "arms.<arm>.speculative", SpeculativeConfig, ' with kind = "transformers"'
            )
            lines += _table("arms.<arm>", OpenAIEngineConfig, ' with kind = "openai"')
            lines += _table("arms.<arm>", FakeEngineConfig, ' with kind = "fake"')
            continue
        if section == "telemetry":
            lines += _telemetry()
            continue
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            lines += _table(section, annotation, "")
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(config_reference(), end="")
