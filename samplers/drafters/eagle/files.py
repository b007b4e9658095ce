"""The model's EAGLE drafter files -> the network (samplers/drafters/eagle/network.py)."""
from __future__ import annotations

import os

from ....model_loaders.files.drafter_files import (CONFIG_FILE, WEIGHTS_FILE, check_shapes, drafter_folder,
                                                   load_drafter, use_random_drafter)
from .lantern_conversion import is_lantern_folder, unconverted_lantern_error
from .network import FOLDER, KIND, EagleConfig, EagleNet, random_eagle


def load_eagle(model, folder: str = "") -> EagleNet:
    """The model's EAGLE drafter: `folder` (or <model folder>/eagle_drafter) when it holds one, a
    random-weight layer for tiny test models (random_drafter_seed), else the ValueError naming
    the training command (or, for a released LANTERN drafter, the conversion command)."""
    path = folder or drafter_folder(model, FOLDER)
    if use_random_drafter(model, folder, path):
        return random_eagle(model, model.random_drafter_seed)
    if path and not os.path.isfile(os.path.join(path, CONFIG_FILE)) and is_lantern_folder(path):
        raise unconverted_lantern_error(model, path)
    tensors, meta = load_drafter(path, KIND, model, beside=FOLDER)
    cfg = EagleConfig.from_dict(meta["config"])
    if cfg.hidden_size != model.hidden_size:
        raise ValueError(f"{path}: drafter width {cfg.hidden_size} != the model's hidden size {model.hidden_size}")
    net = EagleNet(cfg)
    check_shapes(os.path.join(path, WEIGHTS_FILE), tensors, net.expected_shapes())
    net.load_state_dict(tensors)
    return net


__all__ = ["load_eagle"]
