"""`python -m specar convert-checkpoint SRC DST`: a released .pt/.ckpt (loaded with weights_only=True) -> safetensors.
The conversion itself lives in model_loaders/checkpoints.py, next to the loaders that read those files."""
from ..model_loaders.checkpoints import main  # noqa: F401
