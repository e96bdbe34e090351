"""A model whose code ships with its checkpoint (trust_remote_code): Llama's model under its own name."""

from transformers import LlamaForCausalLM

from .configuration_tiny import TinyCustomConfig


class TinyCustomForCausalLM(LlamaForCausalLM):
    config_class = TinyCustomConfig
