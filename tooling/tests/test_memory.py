"""`python -m specar.tooling memory`: every released checkpoint a user runs has a row, the formula's parameter counts
equal the families' own classes built on the meta device, and the README's table is what the command printed."""
import json

import pytest
import torch

from specar.tooling import call
from specar.tooling.memory import CARDS_GIB, checkpoints, memory_row

RELEASED = ["llamagen-xl", "janus-pro-1b", "janus-pro-7b", "emu3-gen", "lumina-mgpt-7b", "lumina-mgpt-2", "anole-7b",
            "emu3.5, emu3.5-image", "glm-image-ar", "glm-image-dit", "glm-image AR + DiT"]


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
            assert r["bf16_gib"] > r["int8_gib"] > r["int4_gib"] > 0
            assert 0 < r["kv_gib"]["16"] < r["kv_gib"]["64"]
    fits = {r["model"]: r["fits"] for r in data["rows"]}
    assert fits["janus-pro-1b"]["8"] == "bf16" and fits["emu3-gen"]["8"] is None and fits["emu3-gen"]["24"] == "bf16"


def test_one_unit_and_a_whole_image_row_for_glm_image():
    """Every size is in GiB, the unit of the cards' column: a fit means weights + KV + the allowance <= the card's
    number (planted: weights in GB against cards in GiB let Lumina-mGPT-7B int4 `fit` 8 GiB at 8.44 GB); GLM-Image's
    whole-image row holds both stages (the DiT in bf16 at every precision of the AR stage)."""
    from specar.tooling.memory import ALLOWANCE_GIB, GIB
    assert GIB == 2 ** 30
    rows = {r["model"]: r for r in (memory_row(c) for c in checkpoints())}
    for r in rows.values():
        for card, w in r["fits"].items():
            if w is not None:
                assert r[f"{w}_gib"] + (r["kv_gib"] or {"64": 0})["64"] + ALLOWANCE_GIB <= int(card), (r["model"], card)
    ar, dit, whole = rows["glm-image-ar"], rows["glm-image-dit"], rows["glm-image AR + DiT"]
    for w in ("bf16", "int8", "int4"):
        assert whole[f"{w}_gib"] == pytest.approx(ar[f"{w}_gib"] + dit["bf16_gib"])
    assert whole["kv_gib"] == ar["kv_gib"] and whole["parameters"] == ar["parameters"] + dit["parameters"]
    # a 16 GiB card holds the AR stage at int8, never the whole image
    assert ar["fits"]["16"] == "int8" and whole["fits"]["16"] is None


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


def test_emu35_counts_equal_our_decoder():
    """Emu3.5's explicit head width (64 heads of 128 on a 5120 width: q and o are 5120 x 8192, k and v 5120 x 1024) as
    our decoder builds it from the assumed 34 B configuration, with the 131072 visual rows of the LM head the loader
    keeps (planted: the head width as hidden / heads fails this)."""
    from torch import nn

    from specar.model_loaders.families.emu35 import Emu35Config
    from specar.model_loaders.families.lumina2 import Lumina2Net
    from specar.tooling.released_models import RELEASED as SPECS
    r = SPECS["emu3.5-image"]
    d = r.spec.dims
    cfg = Emu35Config(dict(vocab_size=d["vocab"], hidden_size=d["hidden"], intermediate_size=d["ffn"],
                           num_hidden_layers=r.spec.layers, num_attention_heads=d["heads"], num_key_value_heads=d["kv"],
                           head_dim=d["head_dim"]), "config.json")
    with torch.device("meta"):
        net = Lumina2Net(cfg)
        net.lm_head = nn.Linear(d["hidden"], d["codes"], bias=False)
    total, q, _, _ = next(c for c in checkpoints() if c.name.startswith("emu3.5")).parameters()
    assert _quantized_and_total(net) == (q, total)


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
    from specar.tooling.memory import GLM_GLYPH_ENCODER, GLM_VAE
    with torch.device("meta"):  # the released transformer/config.json: 32 heads of 128, 30 layers
        dit = diffusers.GlmImageTransformer2DModel(attention_head_dim=128, num_attention_heads=32, num_layers=30)
        glyph = transformers.T5EncoderModel(transformers.T5Config(  # ByT5-small's shape (text_embed_dim 1472)
            vocab_size=384, d_model=1472, d_kv=64, d_ff=3584, num_layers=12, num_heads=6, feed_forward_proj="gated-gelu"))
        vae = diffusers.AutoencoderKL(latent_channels=16, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                                      down_block_types=("DownEncoderBlock2D",) * 4,
                                      up_block_types=("UpDecoderBlock2D",) * 4)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert (GLM_DIT_COUNT[0], GLM_GLYPH_ENCODER, GLM_VAE) == (count(dit), count(glyph), count(vae))
