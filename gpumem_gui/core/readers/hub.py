"""Hugging Face Hub ids (``org/name``) as a model source, behind a small injectable client protocol.

The core never imports ``huggingface_hub``: the real client lives in :mod:`gpumem_gui.hub_client` and is
handed in (tests hand in a fake). A client fetches two things and nothing else: the repo's ``config.json``
and the safetensors *headers* (``huggingface_hub.get_safetensors_metadata`` reads only those, with HTTP
range requests), so no weights are ever downloaded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


@runtime_checkable
class HubClient(Protocol):
    """What gpumem needs from the Hub. Errors are raised as ``GpumemInputError`` with a reason a person
    understands (offline, not installed, gated, not found)."""

    def fetch_config(self, repo_id: str) -> Mapping[str, Any]:
        """The parsed ``config.json`` of ``repo_id``."""
        ...

    def fetch_safetensors_headers(self, repo_id: str) -> Mapping[str, Mapping[str, Any]] | None:
        """``{file name: safetensors header dict}`` for the repo's weight files, or None if it has none."""
        ...


def looks_like_hub_id(text: str) -> bool:
    return bool(HUB_ID.match(text)) and ".." not in text
