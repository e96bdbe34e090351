"""The catalog entries of the architectures released from 2025 on, one module per group of model types."""

from __future__ import annotations

from catalog_new_dense_a import MODELS as DENSE_A
from catalog_new_dense_b import MODELS as DENSE_B
from catalog_new_encoders import MODELS as ENCODERS
from catalog_new_gpt_oss import MODELS as GPT_OSS
from catalog_new_hybrid import MODELS as HYBRID
from catalog_new_linear import MODELS as LINEAR
from catalog_new_llama4 import MODELS as LLAMA4
from catalog_new_mla import MODELS as MLA
from catalog_new_moe import MODELS as MOE
from catalog_new_ssm import MODELS as SSM
from catalog_new_vlm import MODELS as VLM

MODELS = DENSE_A + DENSE_B + MOE + GPT_OSS + LLAMA4 + HYBRID + LINEAR + ENCODERS + VLM + SSM + MLA
