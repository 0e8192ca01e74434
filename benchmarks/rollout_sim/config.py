"""The canaryd.toml of a run: the shipped example's, pointed at loopback (pure).

Each tool's example ships the canaryd configuration it is meant to run with
(`docs/examples/<tool>/canaryd.toml`); a run takes it as it is and changes only what
cannot hold on this host: each arm's `base_url` becomes its loopback server, the storage
and switch paths (under /var/lib there) the run's own directory, `server.listen` a free
loopback port, and each telemetry arm's source a direct scrape of its server's /metrics
(`metrics_url`) in place of Prometheus (`prometheus_url`, `selector`, `queries`): both
sources give the same readings (docs/telemetry.md), and a loopback Prometheus would only
relay the same page. A concurrent stable (`[telemetry.arms.<arm>.stable]`) becomes a
scrape of its own loopback server, the previous revision serving production beside the
canary. Without a shipped file, the arms of docs/progressive-delivery.md and
a direct-scrape `[telemetry]` stand in. `extra` (TOML) is merged over the result last.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.rollout_sim.servers import MODEL

# docs/progressive-delivery.md's arms, for an example that ships no canaryd.toml
GUIDE_ARMS: dict[str, Any] = {
    "baseline": {"kind": "openai", "base_url": "", "server_kind": "vllm", "model": MODEL},
    "speculative": {
        "kind": "openai", "base_url": "", "server_kind": "vllm", "model": MODEL,
        "speculative": True,
    },
}  # fmt: skip
_PROMQL_KEYS = ("prometheus_url", "selector", "queries")


def shipped(examples: Path, tool: str) -> tuple[dict[str, Any], str]:
    """The tool's shipped canaryd configuration and where it came from."""
    path = examples / tool / "canaryd.toml"
    if path.is_file():
        return tomllib.loads(path.read_text(encoding="utf-8")), str(path)
    return {"arms": copy.deepcopy(GUIDE_ARMS)}, "docs/progressive-delivery.md's arms"


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def run_config(
    base: Mapping[str, Any],
    urls: Mapping[str, str],
    port: int,
    data_dir: Path,
    *,
    telemetry: bool,
    stables: Mapping[str, str] | None = None,
    extra: str = "",
) -> dict[str, Any]:
    """`base` pointed at the loopback arms `urls` (arm name -> server root); an arm whose
    shipped source names a concurrent stable (`stable`) scrapes `stables[arm]` as it."""
    config = copy.deepcopy(dict(base))
    arms = config["arms"]
    if set(arms) != set(urls):
        raise ValueError(f"the config's arms {sorted(arms)} are not {sorted(urls)}")
    for name, url in urls.items():
        arms[name]["base_url"] = url
        arms[name].pop("metrics_url", None)  # a window scrape of the real server
    if "url" in config.get("storage", {}):
        config["storage"]["url"] = f"sqlite:///{data_dir / 'canaryd.db'}"
    if "state_file" in config.get("switch", {}):
        config["switch"]["state_file"] = str(data_dir / "switch.json")
    config.setdefault("server", {})["listen"] = f"127.0.0.1:{port}"
    if telemetry:
        section = config.setdefault("telemetry", {})
        sources = section.setdefault("arms", {})
        for name, url in urls.items():
            source = {k: v for k, v in sources.get(name, {}).items() if k not in _PROMQL_KEYS}
            source.setdefault("kind", "vllm")
            source["metrics_url"] = f"{url}/metrics"
            if "stable" in source:
                stable = (stables or {}).get(name)
                if stable is None:
                    raise ValueError(f"the shipped config names a stable for {name!r}: no server")
                source["stable"] = {"metrics_url": f"{stable}/metrics"}
            sources[name] = source
    else:
        config.pop("telemetry", None)
    if extra:
        _merge(config, tomllib.loads(extra))
    return config


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML for {value!r}")


def toml_text(config: Mapping[str, Any], table: str = "") -> str:
    """`config` as TOML: its plain keys, then a table per mapping (dotted names); a table
    that holds only tables gets no header of its own."""
    plain = {k: v for k, v in config.items() if not isinstance(v, Mapping)}
    text = ""
    if table and (plain or not config):
        text += f"\n[{table}]\n"
    text += "".join(f"{_key(k)} = {_value(v)}\n" for k, v in plain.items())
    for key, value in config.items():
        if isinstance(value, Mapping):
            text += toml_text(value, f"{table}.{_key(key)}" if table else _key(key))
    return text
