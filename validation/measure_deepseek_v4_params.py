"""List the parameters transformers builds for a DeepSeek-V4 config (issue 29): every ``named_parameters()``
entry of ``DeepseekV4ForCausalLM`` built on the meta device in bf16 (no memory, no weights), its shape and
dtype (the norms, hyper-connections, sinks and position biases the modeling code keeps in fp32), and the
totals. ``gpumem_gui.core.spec.compressed.deepseek_v4_tensors`` must list the same names and shapes in the
same order (tests/test_arch_dsv4.py).

Run with the ground-truth environment (torch 2.13 CPU, transformers 5.24):
``.venv/bin/python validation/measure_deepseek_v4_params.py tests/reference/extra/configs/
synthetic__deepseek_v4-tiny.json > tests/reference/extra/deepseek_v4_params.json``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def measure(config: Path) -> dict[str, object]:
    import torch
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    raw = json.loads(config.read_text())
    cfg = DeepseekV4Config(
        **{k: v for k, v in raw.items() if k not in ("model_type", "architectures", "torch_dtype")}
    )
    with torch.device("meta"):
        model = DeepseekV4ForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    params = list(model.named_parameters())
    return {
        "about": "DeepseekV4ForCausalLM._from_config(dtype=bfloat16) on the meta device, transformers "
        "5.24: named_parameters() in order (name without the 'model.' prefix, shape, dtype). Script: "
        "validation/measure_deepseek_v4_params.py",
        "config": config.stem,
        "total": sum(p.numel() for _, p in params),
        "fp32": sum(p.numel() for _, p in params if p.dtype == torch.float32),
        "params": [
            [n.removeprefix("model."), list(p.shape), str(p.dtype).removeprefix("torch.")] for n, p in params
        ],
    }


if __name__ == "__main__":
    print(json.dumps(measure(Path(sys.argv[1])), indent=1))
