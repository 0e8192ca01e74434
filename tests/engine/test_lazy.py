"""engine.lazy: a package's TYPE_CHECKING imports are its table of lazy exports. Every name
of each lazy package's `__all__` resolves to the object its module defines, nothing is
imported before it is asked for, an unknown name is an AttributeError naming the
package, and the imports are read with their aliases and relative forms."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from engine.lazy import type_checking_imports

REPO_ROOT = Path(__file__).resolve().parents[2]
LAZY_PACKAGES = ("gates", "canaryd.config", "canaryd.report", "canaryd.store", "canaryd.telemetry")


def source(package: ModuleType) -> str:
    assert package.__file__ is not None
    return Path(package.__file__).read_text(encoding="utf-8")


class TestLazyExports:
    @pytest.mark.parametrize("name", LAZY_PACKAGES)
    def test_every_exported_name_is_its_modules_object(self, name: str) -> None:
        """Each name of `__all__` is defined at import or imported under TYPE_CHECKING, and
        reads as the very object of the module that import names."""
        package = importlib.import_module(name)
        homes = type_checking_imports(source(package), name)
        for exported in package.__all__:
            value = getattr(package, exported)
            if exported in homes:
                module, attribute = homes[exported]
                assert value is getattr(importlib.import_module(module), attribute), exported
        assert set(homes) <= set(package.__all__)
        assert dir(package) == sorted(package.__all__)

    def test_an_unknown_name_is_an_attribute_error(self) -> None:
        """A name the package does not export fails as a missing attribute, naming it."""
        package = importlib.import_module("canaryd.store")
        with pytest.raises(AttributeError, match=r"'canaryd\.store' has no attribute 'Nope'"):
            package.Nope  # noqa: B018 (the attribute access is the test)
        assert not hasattr(package, "Nope")

    def test_a_light_name_imports_no_heavy_neighbour(self) -> None:
        """In a fresh interpreter, the switch's records from `gates` and the database URL
        helpers from `canaryd.store` import neither the gates' statistics (scipy) nor the
        ORM models, and each name is kept once read."""
        code = (
            "import sys, gates, canaryd.store as store\n"
            "first = gates.SwitchState\n"
            "assert store.mask_url is store.mask_url and gates.SwitchState is first\n"
            "assert 'SwitchState' in vars(gates)\n"
            "heavy = ('scipy', 'gates.cycle', 'canaryd.store.models', 'sqlalchemy.orm')\n"
            "print(','.join(m for m in heavy if m in sys.modules))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == ""


class TestTypeCheckingImports:
    def test_aliases_relative_imports_and_other_blocks(self) -> None:
        """`as` names the export and keeps the module's name; a relative import resolves
        against the package; imports outside the TYPE_CHECKING block are not exports."""
        code = (
            "from typing import TYPE_CHECKING\n"
            "import typing\n"
            "from pkg.eager import Eager\n"
            "if TYPE_CHECKING:\n"
            "    from pkg.heavy import Model as HeavyModel, fit\n"
            "    from .sibling import Thing\n"
            "if typing.TYPE_CHECKING:\n"
            "    from ..other import Far\n"
            "if not TYPE_CHECKING:\n"
            "    from pkg.runtime import Never\n"
        )
        assert type_checking_imports(code, "pkg.sub") == {
            "HeavyModel": ("pkg.heavy", "Model"),
            "fit": ("pkg.heavy", "fit"),
            "Thing": ("pkg.sub.sibling", "Thing"),
            "Far": ("pkg.other", "Far"),
        }
