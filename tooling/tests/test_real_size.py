"""The real-size command's path at reduced widths (what CI can run): every family's folder is written in
its real format by `python -m specar.tooling real-size`'s builders, loaded through `specar.load_model`,
generates a few speculative steps, decodes a full grid (GLM-Image: its AR stage alone, both grids, no DiT), and its
forwards are timed; int4 holds
fewer bytes per decoder layer than the unquantized model."""
import pytest
import torch
import transformers

from specar.tooling.real_size import measure, real_params
from specar.tooling.real_size_builders import REDUCED, SPECS, build_folder


def test_every_published_spec_has_a_reduced_twin_and_a_source():
    assert set(SPECS) == set(REDUCED) == {"llamagen-xl", "janus-pro-1b", "emu3-gen", "lumina-mgpt-7b", "anole-7b",
                                                 "glm-image"}
    for s in SPECS.values():
        assert s.source and s.checkpoint and 1 <= s.run_layers <= s.layers
    # per layer 4 d^2 + 3 d f plus embeddings and head: 7.0 B for Chameleon-7B, 0.78 B for LlamaGen-XL
    assert abs(real_params(SPECS["anole-7b"], 32) / 1e9 - 7.01) < 0.01
    assert abs(real_params(SPECS["llamagen-xl"], 36) / 1e9 - 0.78) < 0.01


@pytest.mark.parametrize("name", list(SPECS))
def test_reduced_model_runs_the_real_size_path(name, tmp_path):
    if SPECS[name].family == "glm_image" and not hasattr(transformers, "GlmImageForConditionalGeneration"):
        pytest.skip("this transformers has no GLM-Image")
    folder = build_folder(name, str(tmp_path), layers=1, reduced=True, dtype=torch.float32)
    full = measure(folder, "fp32", "none", steps=2, backend="sjd", repeats=1)
    q4 = measure(folder, "fp32", "int4", steps=2, backend="sjd", repeats=1)
    size = REDUCED[name]["image"]
    for r in (full, q4):
        assert r["generate_steps"] == 2 and r["layers_run"] == 1
        assert r["ms_forward_1"] > 0 and r["ms_forward_17"] > 0 and r["peak_rss_bytes"] > 0
        if name == "glm-image":  # its AR stage alone (no DiT): tokens of both grids, no image
            assert r["image_size"] is None and "no DiT" in r["decode_skipped"] and r["grid"] == [size // 32] * 2
            continue
        assert r["image_size"][0] == size or r["image_size"][1] == size
    assert q4["layer_bytes"] < full["layer_bytes"]
