"""Where a cluster's GPUs are read from: a Prometheus server's URL, a selector, credentials, TLS, limits.

Credentials never travel on the command line (they would show in process lists and shell history): a bearer
token comes from ``GPUMEM_PROMETHEUS_TOKEN`` or a file, basic auth from ``GPUMEM_PROMETHEUS_USER`` and
``GPUMEM_PROMETHEUS_PASSWORD`` or a file holding ``user:password``. A URL with a password in it is refused.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator

from gpumem_gui.core import GpumemInputError, describe_validation_error
from gpumem_gui.hardware.snapshot import _Frozen

TOKEN_ENV = "GPUMEM_PROMETHEUS_TOKEN"
USER_ENV = "GPUMEM_PROMETHEUS_USER"
PASSWORD_ENV = "GPUMEM_PROMETHEUS_PASSWORD"

# a credential file is one short line; anything bigger is not what the user meant to give
_CREDENTIAL_FILE_MAX = 64 * 1024

# one PromQL label matcher: name, operator, double-quoted value (Prometheus docs, "Time series selectors")
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\\n]|\\.)*)"\s*')


def selector_matchers(selector: str) -> str:
    """The label matchers of ``selector`` (``'{cluster="a"}'`` or ``'cluster="a"'``), normalised without
    braces, ready to splice into ``METRIC{...}``. Raises ``ValueError`` naming the position of a malformed
    matcher."""
    s = selector.strip()
    if s.startswith("{"):
        if not s.endswith("}"):
            raise ValueError("a selector that opens with '{' must close with '}'")
        s = s[1:-1]
    out: list[str] = []
    pos = 0
    while pos < len(s) and s[pos:].strip():
        m = _MATCHER.match(s, pos)
        if m is None:
            raise ValueError(f'expected name="value" (or =~, !=, !~) at character {pos + 1}')
        out.append(f'{m.group(1)}{m.group(2)}"{m.group(3)}"')
        pos = m.end()
        if pos < len(s):
            if s[pos] != ",":
                raise ValueError(f"expected ',' between matchers at character {pos + 1}")
            pos += 1
    return ",".join(out)


class PrometheusConfig(_Frozen):
    """How to reach a Prometheus server that scrapes NVIDIA's dcgm-exporter, and how to read it."""

    url: Annotated[str, Field(min_length=1, max_length=2000)] = Field(
        description="the server's base URL, e.g. http://prometheus.example:9090 (a path prefix is kept)"
    )
    selector: Annotated[str, Field(max_length=2000)] = Field(
        "", description='label matchers that narrow every query, e.g. {cluster="a"}'
    )
    host_label: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = Field(
        "Hostname",
        description="label naming a GPU's host (dcgm-exporter: Hostname; 'instance' where it is a pod name)",
    )
    token_file: Path | None = Field(None, description="file holding a bearer token (else $" + TOKEN_ENV + ")")
    basic_auth_file: Path | None = Field(None, description="file holding 'user:password' for basic auth")
    ca_file: Path | None = Field(None, description="PEM file of the CA that signed the server's certificate")
    timeout_s: Annotated[float, Field(gt=0, le=120)] = Field(5.0, description="per request")
    # Prometheus scrapes every 1 m unless configured otherwise (global scrape_interval's default, Prometheus
    # docs "Configuration"): a fresh sample is up to a minute old, so stale means two intervals missed
    stale_after_s: Annotated[float, Field(ge=1, le=86_400)] = Field(
        120.0, description="a GPU whose newest sample is older than this is stale (greyed, never placed)"
    )
    # Prometheus's own default look-back for instant queries (--query.lookback-delta, 5m)
    lookback_s: Annotated[int, Field(ge=10, le=86_400)] = Field(
        300, description="how far back a host that stopped answering is still shown (greyed, with its age)"
    )
    # the most GPUs a fit target holds (core GpuTarget.count, le=4096)
    max_devices: Annotated[int, Field(ge=1, le=100_000)] = Field(
        4096, description="more GPUs than this are cut (and the snapshot says so): narrow with a selector"
    )
    max_response_bytes: Annotated[int, Field(ge=1024, le=1 << 30)] = Field(
        64 << 20, description="a bigger answer is refused (and the snapshot says so)"
    )

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        parts = urlsplit(v.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host, e.g. http://prometheus:9090")
        if parts.username or parts.password:
            raise ValueError(
                f"must not hold credentials (they show in process lists): use {USER_ENV} and {PASSWORD_ENV} "
                "or a basic-auth file"
            )
        if parts.query or parts.fragment:
            raise ValueError("must be the server's base URL, without '?' or '#'")
        try:
            _ = parts.port
        except ValueError as e:
            raise ValueError("has an invalid port") from e
        return v.strip().rstrip("/")

    @field_validator("selector")
    @classmethod
    def _selector(cls, v: str) -> str:
        return selector_matchers(v)


def make_prometheus_config(**fields: object) -> PrometheusConfig:
    """A :class:`PrometheusConfig`, or one line naming the bad field (GpumemInputError)."""
    url = fields.get("url")
    if isinstance(url, str) and "@" in urlsplit(url.strip()).netloc:
        # said before pydantic, whose message would echo the URL and the password in it
        raise GpumemInputError(
            f"must not hold credentials (they show in process lists): use {USER_ENV} and {PASSWORD_ENV} or "
            "a basic-auth file",
            source="prometheus",
            field="url",
        )
    try:
        return PrometheusConfig(**fields)  # type: ignore[arg-type]
    except ValidationError as e:
        raise describe_validation_error(e, source="prometheus") from None


def _read_secret(path: Path, what: str) -> str:
    try:
        if not path.is_file():
            raise GpumemInputError(f"{path}: is not a regular file", field=what)
        if path.stat().st_size > _CREDENTIAL_FILE_MAX:
            raise GpumemInputError(f"{path}: is over {_CREDENTIAL_FILE_MAX} bytes", field=what)
        text = path.read_text(encoding="utf-8").strip()
    except OSError as e:
        raise GpumemInputError(f"{path}: cannot be read ({e.strerror or e})", field=what) from None
    except UnicodeDecodeError:
        raise GpumemInputError(f"{path}: is not UTF-8 text", field=what) from None
    if not text or "\n" in text:
        raise GpumemInputError(f"{path}: must hold exactly one non-empty line", field=what)
    return text


def credentials(cfg: PrometheusConfig) -> tuple[str | None, tuple[str, str] | None]:
    """(bearer token, (user, password)) from the config's files or the environment; at most one of them."""
    token = os.environ.get(TOKEN_ENV) or None
    if cfg.token_file:
        token = _read_secret(cfg.token_file, "token_file")
    basic: tuple[str, str] | None = None
    if cfg.basic_auth_file:
        user, sep, password = _read_secret(cfg.basic_auth_file, "basic_auth_file").partition(":")
        if not sep or not user:
            raise GpumemInputError("must hold 'user:password'", field="basic_auth_file")
        basic = (user, password)
    elif os.environ.get(USER_ENV):
        basic = (os.environ[USER_ENV], os.environ.get(PASSWORD_ENV, ""))
    if token and basic:
        raise GpumemInputError(
            "give a bearer token or basic auth, not both", field="token_file" if cfg.token_file else TOKEN_ENV
        )
    if cfg.ca_file is not None and not cfg.ca_file.is_file():
        raise GpumemInputError(f"{cfg.ca_file}: is not a regular file", field="ca_file")
    return token, basic
