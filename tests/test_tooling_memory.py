"""`python -m specar.tooling memory`: every released checkpoint a user runs has a row, the formula's parameter counts
equal the families' own classes built on the meta device, and the README's table is what the command printed."""
import json

import pytest
import torch

from specar.tooling import call
from specar.tooling.memory import CARDS_GIB, checkpoints, memory_row

RELEASED = ["llamagen-xl", "janus-pro-1b", "janus-pro-7b", "emu3-gen", "lumina-mgpt-7b", "lumina-mgpt-2", "anole-7b",
            "glm-image-ar", "glm-image-dit"]


def _quantized_and_total(module) -> tuple:
    """What quantize converts (linear layers outside `lm_head` and the VQ) and every parameter outside the VQ and the
    norms (the formula leaves those out)."""
    from specar.model_loaders.precision.quantize import SKIP
    q = sum(m.weight.numel() for n, m in module.named_modules()
            if isinstance(m, torch.nn.Linear) and not any(s in n for s in SKIP))
    return q, sum(p.numel() for n, p in module.named_parameters() if "vq" not in n and "norm" not in n)


def test_memory_prints_a_row_per_released_checkpoint(tmp_path, capsys):
    out = tmp_path / "vram.json"
    data = call(["memory", "--json", str(out)])
    printed = capsys.readouterr().out
    assert [r["model"] for r in data["rows"]] == RELEASED
    assert json.loads(out.read_text())["rows"] == data["rows"]
    assert "not measured" in printed
    for r in data["rows"]:
        assert r["model"] in printed
        assert set(r["fits"]) == {str(c) for c in CARDS_GIB}
        if r["model"] != "glm-image-dit":  # the DiT keeps no KV cache and is not quantized by SpecAR
            assert r["bf16_gb"] > r["int8_gb"] > r["int4_gb"] > 0
            assert 0 < r["kv_gb"]["16"] < r["kv_gb"]["64"]
    fits = {r["model"]: r["fits"] for r in data["rows"]}
    assert fits["janus-pro-1b"]["8"] == "bf16" and fits["emu3-gen"]["8"] is None and fits["emu3-gen"]["24"] == "bf16"


@pytest.mark.parametrize("name", ["anole-7b", "emu3-gen"])
def test_formula_equals_the_transformers_class(name):
    """What quantize converts and what stays bf16 (the text lm_head, the embeddings) as the family's own class has
    them (planted: counting lm_head as quantized fails both)."""
    transformers = pytest.importorskip("transformers")
    if name == "anole-7b":  # Chameleon-7B = ChameleonConfig's defaults
        cls, config = transformers.ChameleonForConditionalGeneration, transformers.ChameleonConfig(
            vocabulary_map={"<image>": 8711})
    else:  # Emu3-Gen = Emu3Config's defaults
        cls, config = transformers.Emu3ForConditionalGeneration, transformers.Emu3Config(
            vocabulary_map={"<|extra_200|>": 1, "<image>": 2})
    with torch.device("meta"):
        model = cls(config)
    total, q, _, _ = next(c for c in checkpoints() if c.name == name).parameters()
    assert _quantized_and_total(model) == (q, total)


def test_glm_image_counts_equal_the_released_classes():
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "GlmImageForConditionalGeneration"):
        pytest.skip("transformers without GLM-Image (5.x has it)")
    from specar.tooling.memory import GLM_AR_COUNT, GLM_DIT_COUNT
    from specar.model_loaders.precision.quantize import SKIP
    with torch.device("meta"):
        ar = transformers.GlmImageForConditionalGeneration(transformers.GlmImageConfig())
    lin = [(n, m) for n, m in ar.named_modules() if isinstance(m, torch.nn.Linear) and not any(s in n for s in SKIP)]
    assert GLM_AR_COUNT == (sum(p.numel() for p in ar.parameters()), sum(m.weight.numel() for _, m in lin),
                            sum(m.out_features for _, m in lin), sum(m.weight.numel() // 128 for _, m in lin))
    diffusers = pytest.importorskip("diffusers", reason="the glm-image extra (diffusers) is not installed: the AR "
                                    "stage's counts checked, the DiT's need its class")
    with torch.device("meta"):  # the released transformer/config.json: 32 heads of 128, 30 layers
        dit = diffusers.GlmImageTransformer2DModel(attention_head_dim=128, num_attention_heads=32, num_layers=30)
    assert GLM_DIT_COUNT[0] == sum(p.numel() for p in dit.parameters())
