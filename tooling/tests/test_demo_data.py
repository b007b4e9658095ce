"""The demo model's data and codebook (tooling/demo_data.py, what tooling/train_demo.py trains it on): the data is
deterministic in its seed, and the shipped codebook reconstructs scenes it was not fitted on."""
import numpy as np

import specar
from specar.tooling.demo_data import dataset, encode, psnr


def test_dataset_is_deterministic():
    a, pa, _ = dataset(8, seed=3)
    b, pb, _ = dataset(8, seed=3)
    c, _, _ = dataset(8, seed=4)
    assert np.array_equal(a, b) and pa == pb
    assert not np.array_equal(a, c)
    assert a.shape == (8, 64, 64, 3) and a.dtype == np.uint8


def test_shipped_codebook_reconstructs_held_out_scenes():
    codebook = specar.load_model("demo").codebook
    images, _, _ = dataset(64, seed=4242)
    assert psnr(images, codebook.decode(encode(codebook, images))) > 20.0
