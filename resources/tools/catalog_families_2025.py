"""The catalog entries of the architectures released from 2025 on, one module per group of model types."""

from __future__ import annotations

from catalog_new_dense_a import MODELS as DENSE_A
from catalog_new_dense_b import MODELS as DENSE_B
from catalog_new_encoders import MODELS as ENCODERS
from catalog_new_gemma3n import MODELS as GEMMA3N
from catalog_new_gemma4 import MODELS as GEMMA4
from catalog_new_gpt_oss import MODELS as GPT_OSS
from catalog_new_hybrid import MODELS as HYBRID
from catalog_new_linear import MODELS as LINEAR
from catalog_new_llama4 import MODELS as LLAMA4
from catalog_new_mla import MODELS as MLA
from catalog_new_mllama import MODELS as MLLAMA
from catalog_new_moe import MODELS as MOE
from catalog_new_seq2seq import MODELS as SEQ2SEQ
from catalog_new_ssm import MODELS as SSM
from catalog_new_vlm import MODELS as VLM

MODELS = DENSE_A + DENSE_B + MOE + GPT_OSS + LLAMA4 + HYBRID + LINEAR + ENCODERS + VLM + SSM + MLA + MLLAMA
MODELS += GEMMA4
MODELS += SEQ2SEQ  # issue 14, group seq2seq
MODELS += GEMMA3N  # issue 14, the multimodal Gemma 3n
