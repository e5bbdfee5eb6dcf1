"""The model: config, layers, the Llama-family decoder and its loader."""

from lazyattn.model.config import SUPPORTED_ARCHITECTURES, ModelConfig
from lazyattn.model.llama import CausalLM
from lazyattn.model.loader import load_model

__all__ = ["SUPPORTED_ARCHITECTURES", "CausalLM", "ModelConfig", "load_model"]
