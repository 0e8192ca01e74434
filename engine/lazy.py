"""Exports imported on first use (PEP 562), for packages whose names span heavy modules.

`lazy_exports(namespace)` returns the module-level `__getattr__` and `__dir__` of the
package whose namespace it is given. A name of the package's `__all__` is imported from
its module the first time it is asked for, then kept in the package's namespace, so a
command that needs one light name never imports its heavy neighbours.

Which module holds each name is written once, in the package's imports under
`if TYPE_CHECKING:`: type checkers read those imports, and so does `type_checking_imports`,
from the package's source without running them (running them would import every heavy
module at once). There is no table of names beside them to keep in step; ruff keeps the
block and `__all__` in step (an import `__all__` does not name is unused, a name of
`__all__` without an import undefined). The module lives in `engine`, the lowest layer,
so that `gates`, which imports nothing from `canaryd`, and `canaryd` share it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

__all__ = ["lazy_exports", "type_checking_imports"]


def type_checking_imports(source: str, package: str) -> dict[str, tuple[str, str]]:
    """Of a package's `__init__` source, each name imported under a top-level
    `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`), with the module it comes from and
    its name there (they differ under `as`); relative imports resolved against
    `package`."""
    homes: dict[str, tuple[str, str]] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.If) and _is_type_checking(node.test)):
            continue
        for statement in node.body:
            if not isinstance(statement, ast.ImportFrom):
                continue
            module = statement.module or ""
            if statement.level:
                module = importlib.util.resolve_name("." * statement.level + module, package)
            for alias in statement.names:
                homes[alias.asname or alias.name] = (module, alias.name)
    return homes


def lazy_exports(
    namespace: MutableMapping[str, Any],
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of the package whose module namespace
    (`globals()`) this is: names of its `__all__` imported on first use from the module
    its `if TYPE_CHECKING:` imports name."""
    package: str = namespace["__name__"]
    homes: dict[str, tuple[str, str]] = {}

    def get(name: str) -> Any:
        if name not in namespace.get("__all__", ()):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if not homes:
            homes.update(type_checking_imports(_source(namespace), package))
        if name not in homes:
            raise AttributeError(
                f"module {package!r} exports {name!r} but imports it under no TYPE_CHECKING"
            )
        module, attribute = homes[name]
        value = getattr(importlib.import_module(module), attribute)
        namespace[name] = value
        return value

    def names() -> list[str]:
        return sorted(namespace.get("__all__", ()))

    return get, names


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _source(namespace: MutableMapping[str, Any]) -> str:
    """The package's `__init__` source: its file, else what its loader gives (a zip)."""
    origin = namespace.get("__file__")
    if origin and Path(origin).is_file():
        return Path(origin).read_text(encoding="utf-8")
    source = namespace["__loader__"].get_source(namespace["__name__"])
    if source is None:
        raise ImportError(f"{namespace['__name__']}: no source to read its exports from")
    return str(source)
