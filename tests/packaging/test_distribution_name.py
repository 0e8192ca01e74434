"""The distribution is `canaryd-specdec`: PyPI's `canaryd` is another author's project, so
nothing a user reads or runs (README, docs/, the code, the build files, the lock files) may
tell them to install a distribution named `canaryd` from an index, nor look up installed
metadata under that name. The command and the import package stay `canaryd`."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DISTRIBUTION = "canaryd-specdec"

# `canaryd` as a distribution name: not part of a longer word, a path (/opt/canaryd/,
# dist/canaryd_specdec-…) or a file name (canaryd.toml); `canaryd.` ending a sentence counts.
_NAME = r"(?<![\w/.-])canaryd(?![\w/-])(?!\.\w)"
_INSTALLERS = (
    r"\b(?:pip3?\s+(?:install|download|wheel)|pipx\s+(?:install|run)"
    r"|uv\s+add|uv\s+tool\s+install|poetry\s+add)\b"
)
WRONG = (
    # an installer whose arguments name it (continuation lines already joined)
    re.compile(_INSTALLERS + r"[^\n`|;&#]*?" + _NAME),
    # an extra or a version pin of it: canaryd[local], canaryd==0.1.0, "canaryd>=0.1"
    re.compile(r"(?<![\w/.-])canaryd\s*(?:\[|==|>=|<=|~=|!=)"),
    # installed metadata looked up under it
    re.compile(r"(?:version|distribution|metadata|requires|files)\(\s*[\"']canaryd[\"']"),
)


def scanned() -> list[Path]:
    """What users read or run: README, docs/, the code, the build and deploy files, the
    lock files. Tests are left out (this one spells the wrong lines on purpose)."""
    files = [REPO / name for name in ("README.md", "Makefile", "Containerfile", "pyproject.toml")]
    files += sorted(REPO.glob("requirements*.lock"))
    for folder, patterns in {
        "docs": ("*.md",),
        "canaryd": ("*.py",),
        "engine": ("*.py",),
        "gates": ("*.py",),
        "benchmarks": ("*.py", "*.md"),
        "deploy": ("*.py", "*.yaml", "*.md"),
        "systemd": ("*",),
        ".ci": ("*.sh",),
    }.items():
        for pattern in patterns:
            files += sorted(p for p in (REPO / folder).rglob(pattern) if p.is_file())
    return files


def wrong_lines(text: str) -> list[str]:
    """The lines (shell continuations joined) that install `canaryd` from an index."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if any(p.search(line) for p in WRONG)]


class TestDistributionName:
    def test_project_name_is_ours(self) -> None:
        """pyproject.toml's distribution is `canaryd-specdec`, its `dev` extra names the same
        distribution, and the command is still `canaryd`."""
        project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        assert project["name"] == DISTRIBUTION
        assert any(
            d.startswith(f"{DISTRIBUTION}[") for d in project["optional-dependencies"]["dev"]
        )
        assert project["scripts"] == {"canaryd": "canaryd.cli.app:main"}

    def test_nothing_installs_canaryd_from_an_index(self) -> None:
        """No line of README, docs/, code, build or lock files names `canaryd` as a
        distribution to install, an extra, a pin or a metadata lookup."""
        found = {
            str(path.relative_to(REPO)): bad
            for path in scanned()
            if (bad := wrong_lines(path.read_text(encoding="utf-8", errors="replace")))
        }
        assert found == {}

    def test_the_missing_extra_hints_name_ours(self) -> None:
        """The one-line hints for a missing `local` or `report` extra name
        `canaryd-specdec[…]`."""
        from canaryd.errors import MissingReportExtraError
        from engine.errors import MissingExtraError

        assert f"pip install '{DISTRIBUTION}[local]'" in str(MissingExtraError("x", "torch"))
        assert f"pip install '{DISTRIBUTION}[report]'" in str(MissingReportExtraError("matplotlib"))


class TestWrongLines:
    @pytest.mark.parametrize(
        "line",
        [
            "pip install canaryd",
            "pip install canaryd.",
            "python3 -m pip install -U canaryd==0.1.0",
            "pip install 'canaryd[local]'",
            "pip download --no-deps canaryd",
            "pipx install canaryd",
            "uv add canaryd",
            "pip install --no-index --find-links /wheels \\\n    canaryd \\\n && true",
            'dev = ["canaryd[local,postgres]"]',
            "md.version('canaryd')",
        ],
    )
    def test_flags_canaryd_from_an_index(self, line: str) -> None:
        """Each way of installing PyPI's `canaryd` (or reading its metadata) is flagged."""
        assert wrong_lines(line)

    @pytest.mark.parametrize(
        "line",
        [
            "pip install canaryd-specdec",
            "pip install 'canaryd-specdec[local]'",
            "pip install --no-deps dist/canaryd_specdec-*.whl",
            "sudo /opt/canaryd/.venv/bin/pip install --require-hashes -r requirements-runtime.lock",
            "pip install -e .  # then run canaryd once",
            "sudo install -m 0644 canaryd.toml /etc/canaryd/canaryd.toml",
            "md.version('canaryd-specdec')",
        ],
    )
    def test_leaves_ours_and_the_command_alone(self, line: str) -> None:
        """Our distribution, wheel paths, directories named canaryd and the command pass."""
        assert wrong_lines(line) == []
