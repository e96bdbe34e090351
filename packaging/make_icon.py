"""Draw gpumem's icon: ``packaging/gpumem.svg`` and its 256 px rendering ``packaging/gpumem.png``.

The picture is what gpumem shows: a GPU memory board whose stacked bars (weights, KV cache, activations)
rise towards a dashed capacity line. Both files are committed; run this again only to change the icon:

    QT_QPA_PLATFORM=offscreen .venv/bin/python packaging/make_icon.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZE = 256

# stacked bars: (x, [(height, colour), ...]) from the bottom up;
# weights blue, KV cache amber, activations green
BARS = [
    (58, [(62, "#3b82f6"), (20, "#f59e0b"), (12, "#10b981")]),
    (104, [(62, "#3b82f6"), (38, "#f59e0b"), (16, "#10b981")]),
    (150, [(62, "#3b82f6"), (56, "#f59e0b"), (20, "#10b981")]),
]
BAR_W = 38
BASE_Y = 196
CAP_Y = 64


def svg() -> str:
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{SIZE}" height="{SIZE}" '
        f'viewBox="0 0 {SIZE} {SIZE}">',
        "<title>gpumem</title>",
        "<defs>",
        '<linearGradient id="bg" x1="0" y1="0" x2="0" y2="1">',
        '<stop offset="0" stop-color="#1e293b"/><stop offset="1" stop-color="#0f172a"/>',
        "</linearGradient>",
        "</defs>",
        f'<rect x="8" y="8" width="{SIZE - 16}" height="{SIZE - 16}" rx="40" fill="url(#bg)"/>',
    ]
    # memory-chip pins on the left and right edges
    for y in range(70, 200, 26):
        parts.append(f'<rect x="20" y="{y}" width="16" height="10" rx="3" fill="#64748b"/>')
        parts.append(f'<rect x="{SIZE - 36}" y="{y}" width="16" height="10" rx="3" fill="#64748b"/>')
    # the board
    parts.append(
        '<rect x="42" y="44" width="172" height="168" rx="14" fill="#111827" stroke="#475569" '
        'stroke-width="4"/>'
    )
    for x, segments in BARS:
        y = BASE_Y
        for height, colour in segments:
            y -= height
            parts.append(f'<rect x="{x}" y="{y}" width="{BAR_W}" height="{height}" fill="{colour}"/>')
    # capacity line
    parts.append(
        f'<line x1="50" y1="{CAP_Y}" x2="206" y2="{CAP_Y}" stroke="#ef4444" stroke-width="6" '
        'stroke-dasharray="14 8" stroke-linecap="round"/>'
    )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def render_png(svg_path: Path, png_path: Path) -> None:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    renderer = QSvgRenderer(str(svg_path))
    if not renderer.isValid():
        raise SystemExit(f"make_icon: {svg_path} is not a valid SVG")
    image = QImage(SIZE, SIZE, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    if not image.save(str(png_path), "PNG"):
        raise SystemExit(f"make_icon: could not write {png_path}")


def main() -> int:
    svg_path, png_path = HERE / "gpumem.svg", HERE / "gpumem.png"
    svg_path.write_text(svg(), encoding="utf-8")
    render_png(svg_path, png_path)
    print(f"wrote {svg_path} and {png_path} ({SIZE} px)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
