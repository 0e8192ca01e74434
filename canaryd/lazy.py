"""Exports imported on first use (PEP 562), for packages whose names span heavy modules.

`lazy_exports(package, modules, namespace)` returns the module-level `__getattr__` and
`__dir__` of `package`: a name of `modules` (module → names it exports) is imported from
its module the first time it is asked for, then kept in the package's `namespace`, so a
command that needs one light name never imports its heavy neighbours. (gates/__init__
does the same on its own: gates imports nothing from canaryd.)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, modules: Mapping[str, tuple[str, ...]], namespace: MutableMapping[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    home = {name: module for module, names in modules.items() for name in names}

    def get(name: str) -> Any:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def names() -> list[str]:
        return sorted(namespace.get("__all__", home))

    return get, names
