"""Static ground truth (parameters, KV cache) of Kimi K2.5 configs (issue 14, group mla): the vlm group's
``validation/groundtruth_vlm.py`` with ``Kimi_K25Config`` among the configs built whole
(``Kimi_K25ForConditionalGeneration`` through ``AutoModelForImageTextToText``; ``AutoModelForCausalLM`` has no
class for it), so the MoonViT tower and projector are counted with the text model as the checkpoint holds
them. Writes ``$GT_OUT`` in the tool's format, merged into ``tests/reference/extra/groundtruth_extra.json``::

    GT_CONFIG_DIR=tests/reference/extra/configs GT_OUT=/tmp/gt_kimi.json \\
        /tmp/gt-venv/bin/python validation/groundtruth_kimi.py synthetic__kimi_k25-tiny moonshotai__Kimi-K2.5
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import validation.groundtruth_vlm as vlm

vlm.WHOLE = (*vlm.WHOLE, "Kimi_K25Config")
vlm.NOTE = vlm.NOTE.replace(
    "validation/groundtruth_vlm.py", "validation/groundtruth_kimi.py: groundtruth_vlm.py with Kimi_K25Config"
)

if __name__ == "__main__":
    vlm.main(sys.argv[1:])
