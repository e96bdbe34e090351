"""Build ``resources/models.json`` (the built-in model catalog) from the models' ``config.json`` files.

Regenerate::

    .venv/bin/python resources/tools/build_model_catalog.py [CONFIG_DIR] [--verified FILE] [--out FILE]

``CONFIG_DIR`` (default ``resources/configs``, shipped: trace mode builds catalog models from them) holds one
``config.json`` per model, named ``<org>__<name>.json`` after its Hugging Face id
(``meta-llama__Llama-3.1-8B.json``). ``--verified`` (default ``resources/tools/verified.tsv``) lists, one per
line, ``<file name><TAB><where the copy was read>`` for every config whose text was copied from a real copy of
the published file; configs not listed there were written from memory of the published file and get
``"source_verified": false``. The folder ``shared/reference/configs`` (the project's reference copies) counts
as verified for the files it holds.

What this script adds to each config is in :data:`catalog_models.MODELS`: family, size label and the
parameter count the publisher states, with its source. Each entry's ``spec`` is the compact JSON of the
:class:`~gpumem_gui.core.spec.model.ModelSpec` that
:func:`~gpumem_gui.core.readers.hf_config.spec_from_config` builds (``model_dump(mode="json",
exclude_defaults=True)`` without ``name`` and ``provenance``). The script prints every model's exact count
next to the published figure and stops with an error when one falls outside the
precision the published figure implies, so a wrong config cannot slip in unnoticed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parents[1]
sys.path.insert(0, str(REPO))
if str(TOOLS) not in sys.path:  # run as a script it is there already; imported by path it may not be
    sys.path.insert(0, str(TOOLS))

from catalog_models import MODELS  # noqa: E402

from gpumem_gui.core.readers.hf_config import spec_from_config  # noqa: E402
from gpumem_gui.core.spec.model import Provenance  # noqa: E402
from gpumem_gui.core.spec.params import count_params  # noqa: E402

DEFAULT_CONFIG_DIR = TOOLS.parent / "configs"
REFERENCE_CONFIGS = REPO.parent / "shared" / "reference" / "configs"
OUT = REPO / "resources" / "models.json"


def read_verified(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            name, _, where = line.partition("\t")
            out[name.strip()] = where.strip()
    return out


def compact_spec(cfg: dict, model_id: str, source: str) -> dict:
    spec = spec_from_config(
        cfg, name=model_id, source=source, provenance=Provenance(kind="catalog", source=source)
    )
    d = spec.model_dump(mode="json", exclude_defaults=True)
    for key, value in d.items():  # a discriminated union's tag is a default, but loading needs it
        kind = getattr(getattr(spec, key, None), "kind", None)
        if isinstance(value, dict) and isinstance(kind, str):
            value["kind"] = kind
    d.pop("name", None)
    d.pop("provenance", None)
    d.setdefault("traits", {})  # the catalog loader requires it, Llama's defaults included (DeepSeek-V4)
    return d


def build(config_dir: Path, verified_file: Path) -> tuple[dict, list[str]]:
    verified = read_verified(verified_file)
    problems: list[str] = []
    entries = []
    for m in MODELS:
        file_name = m.id.replace("/", "__") + ".json"
        path = config_dir / file_name
        cfg = json.loads(path.read_text(encoding="utf-8"))
        source = f"https://huggingface.co/{m.id}/blob/main/config.json"
        if (REFERENCE_CONFIGS / file_name).is_file():
            if json.loads((REFERENCE_CONFIGS / file_name).read_text(encoding="utf-8")) != cfg:
                problems.append(f"{file_name}: differs from the reference copy in shared/reference/configs")
            where = f"project reference copy shared/reference/configs/{file_name}"
        else:
            where = verified.get(file_name, "")
        spec = compact_spec(cfg, m.id, source)
        entry = {
            "id": m.id,
            "family": m.family,
            "size_label": m.size_label,
            "moe": "moe" in spec,
            "published_params": m.published.params,
            "published_params_source": m.published.source,
            "published_params_precision": round(m.published.precision, 6),
            **({"published_params_note": m.published.note} if m.published.note else {}),
            "source": source,
            "source_verified": bool(where),
            **({"verified_from": where} if where else {}),
            "spec": spec,
        }
        total = count_params(spec_from_config(cfg, name=m.id, source=source)).total
        rel = abs(total - m.published.params) / m.published.params
        flag = "ok" if rel <= entry["published_params_precision"] else "OUTSIDE"
        print(
            f"{m.id:42s} exact {total:>17,d}  published {m.published.params:>17,d}  "
            f"diff {rel:8.4%} / {entry['published_params_precision']:.4%}  {flag}"
            f"{'  verified' if where else ''}"
        )
        if flag != "ok":
            problems.append(
                f"{m.id}: exact count {total:,} is {rel:.3%} from the published {m.published.params:,}"
            )
        entries.append(entry)
    return {"format": "gpumem-model-catalog", "version": 1, "models": entries}, problems


_SCALAR = r'(?:"[^"\n]*"|[-\d.eE+]+|true|false|null)'
_FLAT_LIST = re.compile(rf"\[\s*({_SCALAR}(?:,\s*{_SCALAR})*)\s*\]")


def dump(doc: dict) -> str:
    """Indented JSON, with lists of plain values on one line (layer_types would otherwise take 100 lines)."""
    text = json.dumps(doc, indent=2, ensure_ascii=False)

    def one_line(m: re.Match[str]) -> str:
        items = [s.strip() for s in m.group(1).split(",")]
        return "[" + ", ".join(items) + "]"

    return _FLAT_LIST.sub(one_line, text) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config_dir", nargs="?", type=Path, default=DEFAULT_CONFIG_DIR)
    ap.add_argument(
        "--verified", type=Path, help="TSV of verified configs (default resources/tools/verified.tsv)"
    )
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    verified_file = args.verified or TOOLS / "verified.tsv"
    doc, problems = build(args.config_dir, verified_file)
    if problems:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        return 1
    args.out.write_text(dump(doc), encoding="utf-8")
    n_ver = sum(e["source_verified"] for e in doc["models"])
    print(f"wrote {args.out} ({len(doc['models'])} models, {n_ver} with verified configs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
