"""Keeping credentials out of what canaryd shows: logs, /healthz and /readyz, metrics.

`redact_text` masks the secrets a driver message, an exception or a URL can carry: a
URL's password (`scheme://user:***@host`), secret `key=value` and query parameters
(`password=***`, `api_key=***`, `token=***`, …) and `Authorization` or `Bearer`
credentials. `redact_value` applies it through JSON-like values and masks, whole, a
string stored under a secret-named key (`is_secret_key`). `public_url` is the allowlisted
form of an HTTP URL that may be exported as a label: scheme, host, port and path, never
userinfo, query or fragment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["MASK", "is_secret_key", "public_url", "redact_text", "redact_value"]

MASK = "***"

_USERINFO = re.compile(
    r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<user>[^\s/?#@:]*):(?P<password>[^\s/?#@]+)@"
)
_SECRET_PARAMETER = re.compile(
    r"(?P<key>\b(?:password|passwd|pwd|passphrase|sslpassword|sslkey|passfile|secret"
    r"|client_secret|token|access_token|refresh_token|id_token|auth_token|api[_-]?key"
    r"|access_key|secret_key|private_key|signature|sig)\s*=\s*)"
    r"(?P<quote>['\"]?)(?P<value>[^\s&'\";,)\]}]+)",
    re.IGNORECASE,
)
_AUTHORIZATION = re.compile(
    r"(?P<key>\b(?:proxy-)?authorization\s*[:=]\s*['\"]?(?:(?:bearer|basic|token|digest)\s+)?)"
    r"(?P<value>[^\s'\",;]+)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?P<key>\bbearer\s+)(?P<value>[A-Za-z0-9._~+/\-]+=*)", re.IGNORECASE)

# Parts of a key (split on "_", "-" and ".") that name a secret. Whole parts only:
# "output_tokens" and "token_ids" hold counts and ids, not credentials, and are not
# strings anyway (only string values are masked).
_SECRET_KEY_PARTS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "secret",
        "token",
        "apikey",
        "authorization",
        "cookie",
        "credential",
        "credentials",
    }
)
_SECRET_KEY_SUFFIXES = ("api_key", "access_key", "private_key", "secret_key")


def is_secret_key(key: str) -> bool:
    """Whether a value stored under `key` is a credential (`password`, `api_key`, …)."""
    normalised = key.lower().replace("-", "_").replace(".", "_")
    if normalised.endswith(_SECRET_KEY_SUFFIXES):
        return True
    return any(part in _SECRET_KEY_PARTS for part in normalised.split("_"))


def redact_text(text: str) -> str:
    """`text` with URL passwords, secret parameters and authorization values masked."""
    if "=" not in text and "@" not in text and ":" not in text and " " not in text:
        return text  # nothing any pattern below could match
    text = _USERINFO.sub(rf"\g<scheme>\g<user>:{MASK}@", text)
    text = _SECRET_PARAMETER.sub(rf"\g<key>\g<quote>{MASK}", text)
    text = _AUTHORIZATION.sub(rf"\g<key>{MASK}", text)
    return _BEARER.sub(rf"\g<key>{MASK}", text)


def redact_value(value: Any) -> Any:
    """`value` with every string redacted, through mappings, lists and tuples; a string
    under a secret-named key is masked whole."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            key: MASK
            if isinstance(item, str) and isinstance(key, str) and is_secret_key(key)
            else redact_value(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(redact_value(item) for item in value)
    return value


def public_url(url: str) -> str:
    """`scheme://host[:port]/path` of `url`: userinfo, query and fragment dropped (they
    carry credentials: `https://user:key@host/v1?api_key=…`)."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return redact_text(url)
    if not parts.scheme or not host:
        return redact_text(url)
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc = f"{netloc}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
