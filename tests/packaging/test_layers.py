"""The shape of the product's code, read from its source with `ast` (not from what one run
happens to import): the packages depend one way, engine → gates → canaryd, and none on
benchmarks/; gates/ is built in the layers of `GATES_LAYERS`, each importing only from
layers below it; no import cycle, between modules nor between the folders of a package
(those of gates/, canaryd/'s packages, engine/'s); and the size rules: at most
`MAX_GATES_ROOT` modules at the root of gates/, no product module over `MAX_MODULE_LINES`
lines, no function of canaryd/judging/ over `MAX_JUDGING_FUNCTION_LINES`.

An import counts wherever it is written: at the top of a module, inside a function, and
under `if TYPE_CHECKING:` too, none left out: a package's lazy exports (`engine.lazy`) are
imported at run time from the modules its `TYPE_CHECKING` block names, and elsewhere a
type-only import still ties two modules together. `from package import name` is an import
of `package.name` when that is a module, else of the package (its `__init__`). At the
package level a module at a package's root is a node of its own and every folder below
the root is one node: an import between two modules of one folder stays inside it.
canaryd/'s packages have no order stated in docs/architecture.md (it lists them by role),
so for them this asks for no cycle, which is what any order needs.
"""

from __future__ import annotations

import ast
import functools
import graphlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("engine", "gates", "canaryd")
MAX_GATES_ROOT = 10
MAX_MODULE_LINES = 600
MAX_JUDGING_FUNCTION_LINES = 80

# What each product package may not import (benchmarks/ sits above all three).
FORBIDDEN = {
    "engine": ("gates", "canaryd", "benchmarks"),
    "gates": ("canaryd", "benchmarks"),
    "canaryd": ("benchmarks",),
}

# The layers of gates/, lowest first; a node may import only from nodes of lower layers.
GATES_LAYERS: tuple[tuple[str, ...], ...] = (
    ("gates.core", "gates.records"),  # decisions and their states; the domain records
    ("gates.config_base",),  # what every configuration section is built on
    ("gates.window", "gates.switch"),  # the window rules; the switch policy and its section
    ("gates.config",),  # every gate's section, the budget's, `GatesConfig`
    ("gates.stats",),  # detectors, bounds, histograms and the budget's split of the config
    ("gates.pairs", "gates.telemetry", "gates.parity"),  # the gates, by what they read
    ("gates.evidence",),  # the one value a judgement reads
    ("gates.cycle",),  # the registry and the one judging path
    ("gates.estimate", "gates"),  # how far a verdict is from deciding; the package's exports
)


@dataclass(frozen=True, slots=True)
class Module:
    """One product module: its dotted name, file and parsed source."""

    name: str
    path: Path
    tree: ast.Module

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


@functools.cache
def modules() -> dict[str, Module]:
    """Every module of engine/, gates/ and canaryd/, by dotted name."""
    found: dict[str, Module] = {}
    for package in PRODUCT:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            found[name] = Module(name, path, ast.parse(path.read_text(encoding="utf-8")))
    return found


def imported_names(module: Module) -> set[str]:
    """The dotted name of everything `module` imports, relative imports resolved."""
    names: set[str] = set()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.name.split(".")
                if not module.is_package:
                    here.pop()
                here = here[: len(here) - (node.level - 1)]
                base = ".".join([*here, *([node.module] if node.module else [])])
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def resolve(name: str, known: set[str]) -> str | None:
    """The longest product module that `name` is or lies in (None: not a product module)."""
    parts = name.split(".")
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts) or None


@functools.cache
def module_graph() -> dict[str, frozenset[str]]:
    """Every product module → the product modules it imports (itself left out)."""
    known = set(modules())
    graph: dict[str, frozenset[str]] = {}
    for name, module in modules().items():
        targets = {resolve(n, known) for n in imported_names(module)}
        graph[name] = frozenset(t for t in targets if t is not None and t != name)
    return graph


def node_of(name: str, package: str) -> str:
    """The package-level node of module `name` of `package`: a module at the package's
    root is its own node, a module in a folder below it is that folder's."""
    parts = name.split(".")
    if len(parts) == 1 or (len(parts) == 2 and not (REPO / package / parts[1]).is_dir()):
        return name
    return ".".join(parts[:2])


def package_graph(package: str) -> dict[str, set[str]]:
    """The package-level imports inside `package` (between its root modules and folders)."""
    graph: dict[str, set[str]] = {}
    for name, targets in module_graph().items():
        if name.split(".")[0] != package:
            continue
        node = node_of(name, package)
        edges = graph.setdefault(node, set())
        edges.update(node_of(t, package) for t in targets if t.split(".")[0] == package)
        edges.discard(node)
    return graph


def cycle_in(graph: Mapping[str, Collection[str]]) -> list[str]:
    """One import cycle of `graph`, empty when there is none."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return list(error.args[1])
    return []


class TestDirection:
    @pytest.mark.parametrize("package", PRODUCT)
    def test_a_package_imports_nothing_from_those_above_it(self, package: str) -> None:
        """No module of engine/, gates/ or canaryd/ imports a package above its own."""
        above = FORBIDDEN[package]
        upward = sorted(
            f"{module.name} imports {name}"
            for module in modules().values()
            if module.name.split(".")[0] == package
            for name in imported_names(module)
            if name.split(".")[0] in above
        )
        assert upward == []


class TestGatesLayers:
    def test_every_folder_and_root_module_of_gates_has_one_layer(self) -> None:
        """GATES_LAYERS names each folder and root module of gates/ once, and nothing else."""
        listed = [node for layer in GATES_LAYERS for node in layer]
        assert len(listed) == len(set(listed))
        assert set(listed) == set(package_graph("gates"))

    def test_a_layer_imports_only_from_the_layers_below(self) -> None:
        """Every import between two nodes of gates/ goes from a higher layer to a lower one."""
        layer = {node: i for i, nodes in enumerate(GATES_LAYERS) for node in nodes}
        sideways_or_up = sorted(
            f"{node} (layer {layer.get(node)}) imports {target} (layer {layer.get(target)})"
            for node, targets in package_graph("gates").items()
            for target in targets
            if node not in layer or target not in layer or layer[target] >= layer[node]
        )
        assert sideways_or_up == []

    def test_stats_imports_no_gate(self) -> None:
        """gates/stats/ imports none of the gates, the switch policy or the judging path."""
        gates_above = {"gates.pairs", "gates.telemetry", "gates.switch", "gates.parity"}
        gates_above |= {"gates.cycle", "gates.evidence", "gates.estimate"}
        assert package_graph("gates")["gates.stats"] & gates_above == set()

    def test_of_stats_only_the_budget_reads_the_whole_config(self) -> None:
        """Of gates/stats/, only the budget (it splits the budget between the config's
        gates) imports `gates.config`; the rest reads at most `gates.config_base`."""
        readers = sorted(
            name
            for name, targets in module_graph().items()
            if name.startswith("gates.stats.") and "gates.config" in targets
        )
        assert readers == ["gates.stats.budget"]


class TestCycles:
    def test_no_cycle_between_modules(self) -> None:
        """No chain of imports leads from a product module back to itself."""
        assert cycle_in(module_graph()) == []

    @pytest.mark.parametrize("package", PRODUCT)
    def test_no_cycle_between_folders(self, package: str) -> None:
        """No chain of imports leads from a folder or root module of a package back to it."""
        assert cycle_in(package_graph(package)) == []


class TestSizes:
    def test_gates_root_holds_few_modules(self) -> None:
        """gates/ keeps at most MAX_GATES_ROOT modules (its __init__ included) at its root."""
        root = sorted(p.name for p in (REPO / "gates").glob("*.py"))
        assert len(root) <= MAX_GATES_ROOT, root

    def test_no_product_module_is_long(self) -> None:
        """Every module of engine/, gates/ and canaryd/ has at most MAX_MODULE_LINES lines."""
        long = sorted(
            f"{m.path.relative_to(REPO)}: {lines} lines"
            for m in modules().values()
            if (lines := len(m.path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
        )
        assert long == []

    def test_no_judging_function_is_long(self) -> None:
        """Every function of canaryd/judging/ (methods and nested ones each on its own) has at
        most MAX_JUDGING_FUNCTION_LINES lines, from `def` to its last line."""
        long = sorted(
            f"{m.path.relative_to(REPO)}:{node.lineno} {node.name}: {length} lines"
            for m in modules().values()
            if m.name.startswith("canaryd.judging.") or m.name == "canaryd.judging"
            for node in ast.walk(m.tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno is not None
            and (length := node.end_lineno - node.lineno + 1) > MAX_JUDGING_FUNCTION_LINES
        )
        assert long == []
