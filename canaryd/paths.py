"""Where canaryd keeps its data and finds the files it ships (prompts, migrations)."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
_REPO_ROOT = _PACKAGE_DIR.parent


def data_dir() -> Path:
    """`CANARYD_DATA_DIR`, else `$XDG_CACHE_HOME/canaryd`, else `~/.cache/canaryd`."""
    explicit = os.environ.get("CANARYD_DATA_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "canaryd"


def models_dir() -> Path:
    return data_dir() / "models"


def default_database_url() -> str:
    return f"sqlite:///{data_dir() / 'canaryd.db'}"


def _shipped(name: str) -> Path:
    """A data directory shipped with canaryd: inside the wheel, or at the repo root."""
    installed = _PACKAGE_DIR / "_data" / name
    return installed if installed.exists() else _REPO_ROOT / name


def prompts_dir() -> Path:
    return _shipped("prompts")


def alembic_dir() -> Path:
    return _shipped("alembic")
