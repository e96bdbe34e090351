"""vLLM's ``--limit-mm-per-prompt``, read for :mod:`gpumem_gui.core.imports.vllm`."""

from __future__ import annotations

import json

from gpumem_gui.core.imports.base import Arg, Reading, to_int
from gpumem_gui.core.runtimes.run import InferenceRun


def mm_limit(r: Reading, arg: Arg, why: str) -> None:
    """``--limit-mm-per-prompt '{"image": 2, "video": 0}'`` (or the older ``image=2,video=0``): the images
    per prompt are read; other modalities are named (gpumem's vision models take images); without the
    images_per_prompt field, a warning saying ``why``."""
    text = (arg.value or "").strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            raise r.error(arg.where, 'expected a JSON object such as {"image": 2}') from None
        if not isinstance(data, dict):
            raise r.error(arg.where, 'expected a JSON object such as {"image": 2}')
    else:
        pairs = [p.partition("=") for p in text.split(",") if p.strip()]
        if not pairs or any(not sep for _, sep, _ in pairs):
            raise r.error(arg.where, "expected image=N[,video=M] or a JSON object")
        data = {k.strip(): v.strip() for k, _, v in pairs}
    if "image" in data:
        n = to_int(data["image"], f"{arg.where} image", lo=0, hi=1 << 16)
        r.maybe(InferenceRun, ("images_per_prompt",), n, arg.where, arg.text, why)
    rest = sorted(str(k) for k in data if k != "image")
    if rest:
        r.warn(f"{arg.name} {{{', '.join(rest)}}}", "only images are modelled (vision towers)")
