"""The embedded demo model: procedural data, patch-codebook tokenizer, training and loading."""
from .model import load_demo_model

__all__ = ["load_demo_model"]
