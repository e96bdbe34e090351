"""A model whose code ships with its checkpoint (trust_remote_code): Llama's config under its own name."""

from transformers import LlamaConfig


class TinyCustomConfig(LlamaConfig):
    model_type = "tiny_custom"
