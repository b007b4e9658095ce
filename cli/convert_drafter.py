"""`python -m specar convert-drafter --kind lantern <folder> --model <model folder> [--out DIR]`: a released
drafter (LANTERN's Anole / LlamaGen EAGLE drafters) -> SpecAR's drafter.json + drafter.safetensors, bound to
the model's weight fingerprint. The conversion lives in model_loaders/lantern_drafter.py."""
from ..model_loaders.lantern_drafter import main  # noqa: F401
