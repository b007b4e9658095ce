"""Chameleon-family adapter (Lumina-mGPT and Anole layouts) on a tiny random-weight
`ChameleonForConditionalGeneration` saved in the real on-disk format (config.json with
vocabulary_map, model.safetensors, tokenizer.json, tokenizer_config.json) plus a tiny Chameleon
image tokenizer (vqgan.yaml + vqgan.ckpt as Meta ships them: a Lightning-style ``state_dict``
with encoder and loss weights next to the decoder's), loaded by `specar.load_model`.

Reference generation: transformers' ``generate`` cannot sample image tokens for Chameleon (its
``forward`` sets image logits to the dtype minimum), so the reference is a plain loop over the
transformers model that recomputes the whole sequence every step (no cache), takes
``lm_head(model.model(ids).last_hidden_state)`` restricted to the image ids, combines CFG as
Lumina-mGPT's logits processor does (``s * (cond - uncond) + uncond``, the unconditional branch
in its own unbatched call) and, for Lumina-mGPT, forces the newline token where Lumina-mGPT's
``MultiModalLogitsProcessor`` forces it (``(len(tokens) + 1) % (W + 1) == 0``).
"""
import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "ChameleonForConditionalGeneration"):
    pytest.skip("this transformers has no Chameleon", allow_module_level=True)

import specar
from support.conformance import check_conformance
from specar.model_loaders.families.chameleon import code_token_name, lumina_sizes
from specar.model_loaders.families.chameleon_vqgan import VQGANDecoder
from support.exactness import chi_square_test, exact_distribution, mark_long
from support.calls import generate_kwargs

TOL = 1e-5
N_SAMPLES = 16000
P_FAIL = 1e-6
PROMPT = "a red cat"
VQGAN = dict(n_embed=4, embed_dim=4, z_channels=4, ch=32, ch_mult=[1, 1, 1, 1, 1], num_res_blocks=1, resolution=32,
             attn_resolutions=[2])
WIDE = dict(layout="lumina", target_size=64, resolution="64x32")  # 2 rows of 4 codes (+ newline each)
SQUARE = dict(layout="lumina", target_size=32)  # 2x2 codes: 4^4 = 256 images for the chi-square test


class NotATensor:  # what a pickled Lightning callback looks like to torch.load(weights_only=True)
    pass


def vqgan_yaml(p):
    return ("model:\n  target: chameleon.vqgan.VQModel\n  params:\n"
            f"    embed_dim: {p['embed_dim']}\n    n_embed: {p['n_embed']}\n    ddconfig:\n"
            f"      double_z: false\n      z_channels: {p['z_channels']}\n      resolution: {p['resolution']}\n"
            f"      in_channels: 3\n      out_ch: 3\n      ch: {p['ch']}\n      ch_mult: {p['ch_mult']}\n"
            f"      num_res_blocks: {p['num_res_blocks']}\n      attn_resolutions: {p['attn_resolutions']}\n"
            "      dropout: 0.0\n    lossconfig:\n      target: torch.nn.Identity\n")


def build_tiny_chameleon(folder, codes=4, seed=0, hidden=32):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration, PreTrainedTokenizerFast

    words = ["<unk>", "a", "red", "blue", "cat", "dog", "on", "the", "grass", "sky", "no", "blurry", "Generate",
             "an", "image", "of", "according", "to", "following", "prompt", ":", "32x32", "64x32"]
    specials = ["<s>", "</s>", "<pad>", "<image>", "<racm3:break>", "<eoss>", "<reserved08706>", "<reserved08799>",
                "<reserved08801>", "<reserved08802>"] + [code_token_name(c) for c in range(codes)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens(specials)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>")
    cfg = ChameleonConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, vocabulary_map=tok.get_vocab(),
        vq_config=dict(embed_dim=4, num_embeddings=codes, latent_channels=4, resolution=32, base_channels=32,
                       channel_multiplier=[1, 1, 1, 1, 1], num_res_blocks=1, attn_resolutions=[]),
        architectures=["ChameleonForConditionalGeneration"])
    torch.manual_seed(seed)
    model = ChameleonForConditionalGeneration(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # unit-scale weights: next-code distributions far from uniform
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "vqmodel" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "embed" in name else p.shape[-1] ** -0.5))
        model.lm_head.weight.mul_(3.0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    dec = VQGANDecoder(**dict(VQGAN, n_embed=codes))
    sd = {k: torch.randn(v.shape, generator=g) * 0.3 if v.dim() > 1 else v for k, v in dec.state_dict().items()}
    sd["encoder.conv_in.weight"] = torch.zeros(32, 3, 3, 3)  # the tokenizer's encoder: ignored by the decoder
    sd["loss.logvar"] = torch.zeros(())
    torch.save({"state_dict": sd, "global_step": 7}, os.path.join(folder, "vqgan.ckpt"))
    with open(os.path.join(folder, "vqgan.yaml"), "w") as f:
        f.write(vqgan_yaml(dict(VQGAN, n_embed=codes)))
    return model, tok


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("chameleon") / "Lumina-mGPT-tiny")
    hf, tok = build_tiny_chameleon(folder)
    return folder, hf, tok, specar.load_model(folder, **WIDE)


@pytest.fixture(scope="module")
def mdl(tiny):
    return tiny[3]


@pytest.fixture(scope="module")
def square(tiny):
    return specar.load_model(tiny[0], **SQUARE)


@pytest.fixture(scope="module")
def anole(tiny):
    return specar.load_model(tiny[0], layout="anole")


@torch.no_grad()
def reference_greedy(hf, mdl, text, negative, scale):
    """Plain full-recomputation greedy loop over the transformers model (see the module docstring)."""
    enc = mdl.encode_prompt(text, negative)
    img_ids = mdl._img_ids
    W, n = mdl.geometry.width, mdl.geometry.seq_len
    newline = mdl.tokenizer.convert_tokens_to_ids("<reserved08799>")
    lumina = mdl.layout == "lumina"
    out = []

    def image_logits(ids):
        h = hf.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
        return hf.lm_head(h)[img_ids]

    for k in range(n):
        if lumina and (k + 1) % (W + 1) == 0:
            out.append(newline)
            continue
        c, u = image_logits(enc.cond + out), image_logits(enc.uncond + out)
        out.append(int(img_ids[int((scale * (c - u) + u).argmax())]))
    return enc, out


def test_layouts_prompts_and_defaults(tiny, mdl, square, anole):
    folder, hf, tok, _ = tiny
    g = mdl.geometry
    assert (g.height, g.width, g.vocab_size, g.row_end) == (2, 4, 4, True)
    assert (anole.geometry.height, anole.geometry.width, anole.geometry.row_end) == (2, 2, False)
    assert mdl.default_sampling == {"cfg_scale": 3.0, "top_k": 4}  # Lumina-mGPT: top-k 2000 capped at 4 codes
    # Anole: Chameleon's inference samples at temperature 0.7, top-p 0.9, what generate (and the node) use by default
    assert anole.default_sampling == {"cfg_scale": 3.0, "top_k": 0, "temperature": 0.7, "top_p": 0.9}
    assert specar.generate(anole, PROMPT, backend="ar", seed=1).stats.sampling["temperature"] == 0.7
    assert mdl.format_prompt(PROMPT) == "Generate an image of 64x32 according to the following prompt:\na red cat"
    v = tok.get_vocab()
    enc = mdl.encode_prompt(PROMPT)
    size = [v["<reserved08801>"], v["<reserved08802>"]]  # height 32 px = 1 patch, width 64 px = 2 patches
    assert enc.cond[0] == tok.bos_token_id and enc.cond[-4:] == [v["<reserved08706>"], v["<racm3:break>"]] + size
    assert enc.uncond == [v["<racm3:break>"]] + size  # Lumina-mGPT's CFG branch starts at image start
    a = anole.encode_prompt(PROMPT)
    assert a.cond == [tok.bos_token_id] + tok(PROMPT, add_special_tokens=False).input_ids + [v["<racm3:break>"]]
    assert a.uncond == [tok.bos_token_id, v["<racm3:break>"]]
    # Lumina-mGPT's own size lists (its demo's resolution menu)
    assert ("768x768" in [f"{w}x{h}" for w, h in lumina_sizes(768)]) and (1024, 1024) in lumina_sizes(1024)
    assert (1536, 384) in lumina_sizes(768) and (32, 128) in lumina_sizes(64)


def test_decoder_parameter_names_are_the_chameleon_tokenizers():
    names = set(VQGANDecoder(**VQGAN).state_dict())
    for n in ("quantize.embedding.weight", "post_quant_conv.weight", "decoder.conv_in.weight",
              "decoder.mid.block_1.norm1.weight", "decoder.mid.attn_1.q.weight", "decoder.mid.block_2.conv2.bias",
              "decoder.up.4.block.0.conv1.weight", "decoder.up.4.attn.1.proj_out.weight",
              "decoder.up.1.upsample.conv.weight", "decoder.norm_out.weight", "decoder.conv_out.weight"):
        assert n in names, n
    assert not any(n.startswith("decoder.up.0.upsample") for n in names)  # the last level does not upsample


@pytest.mark.parametrize("which,text,negative", [("lumina", PROMPT, ""), ("lumina", "blue dog on the grass", "blurry"),
                                                 ("anole", "sky", "")])
def test_ar_reproduces_reference_greedy(tiny, mdl, anole, which, text, negative):
    m = mdl if which == "lumina" else anole
    enc, ref = reference_greedy(tiny[1], m, text, negative, 3.0)
    res = specar.generate(m, text, negative_prompt=negative, backend="ar", sampling=dict(temperature=0, cfg_scale=3.0))
    ids = m.to_model_ids(res.sequence)[0]
    assert ids[:-1].tolist() == ref and int(ids[-1]) == m.eoi_id
    pix = m.vqgan(res.tokens[None])[0].permute(1, 2, 0)
    expected = ((pix.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()
    assert (torch.tensor(list(res.image.tobytes()), dtype=torch.uint8).view(expected.shape).numpy() == expected).all()


@pytest.mark.parametrize("backend", list(specar.BACKENDS))
def test_every_backend_end_to_end_with_newlines_in_place(mdl, anole, backend, monkeypatch):
    for m in (mdl, anole,):  # hawk / adt_tree: random-weight drafters (no trained files for a random tiny model)
        monkeypatch.setattr(m, "random_drafter_seed", 0, raising=False)
    H, W, V = mdl.geometry.height, mdl.geometry.width, mdl.geometry.vocab_size
    res = specar.generate(mdl, PROMPT, backend=backend, seed=5, batch_size=3, negative_prompt="blurry")
    assert res.tokens.shape == (3, H, W)
    assert len(res.images) == 3 and all(im.size == (64, 32) for im in res.images)
    seq = res.sequence.cpu()
    assert (seq[:, W::W + 1] == V).all() and (seq.view(3, H, W + 1)[:, :, :W] < V).all()
    assert res.stats.forced_tokens == H  # one newline per row, filled in by the engine
    ids = mdl.to_model_ids(seq)
    assert (ids[:, W:-1:W + 1] == mdl.tokenizer.convert_tokens_to_ids("<reserved08799>")).all()
    assert (ids[:, -1] == mdl.eoi_id).all()
    res = specar.generate(anole, PROMPT, backend=backend, seed=5, batch_size=2)
    assert res.tokens.shape == (2, 2, 2) and all(im.size == (32, 32) for im in res.images)


@pytest.mark.parametrize("cfg", [False, True])
def test_adapter_conformance(mdl, anole, cfg):
    from support.conformance import check_commit_path, check_hidden_states, check_per_row_trees, \
        check_tree_forward
    for check in (check_tree_forward, check_per_row_trees, check_commit_path, check_hidden_states):
        check(mdl, cfg, TOL)
    check_per_row_trees(anole, cfg, TOL)


EXACT_CASES = [
    ("sjd", dict(window=3, init="random"), dict(cfg_scale=2.0)),
    ("scd", dict(window=3, coupling="maximal"), dict(cfg_scale=2.0, negative_prompt="blurry")),
    ("sjd_pac", dict(window=3, tree_depth=2, tree_width=3), dict(cfg_scale=2.0)),
]


# `make test-long` runs these (pytest.mark.long): the family's forwards are checked against sequential ones by
# test_adapter_conformance in `make test`, the backends' exactness on tiny models by tests/test_exactness.py
@pytest.mark.parametrize("case", mark_long(EXACT_CASES, ()), ids=lambda c: c[0])
def test_exactness_chi_square(square, monkeypatch, case):
    backend, params, settings = case
    monkeypatch.setattr(square, "decode_tokens", lambda tokens, prompt=None: None)  # 16000 VQ decodes are not the point
    assert square.geometry.seq_len == 6 and square.geometry.num_image_tokens == 4  # newlines included
    res = specar.generate(square, PROMPT, **generate_kwargs(backend=backend, **settings, **params), seed=4321,
                          batch_size=N_SAMPLES)
    exact = exact_distribution(square, PROMPT, **settings)
    p, stat, dof, tv = chi_square_test(res.tokens, exact)
    assert p > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p:.2e} TV={tv:.4f}"


# -- files: conversion, bad folders, mismatched weights, unsafe checkpoints -------------------------
def _copy(tiny, tmp_path, name="copy"):
    dst = tmp_path / name
    shutil.copytree(tiny[0], dst)
    return dst


def test_safetensors_conversion_decodes_the_same(tiny, mdl, tmp_path):
    from specar.__main__ import main
    dst = _copy(tiny, tmp_path)
    assert main(["convert-checkpoint", str(dst / "vqgan.ckpt"), str(dst / "vqgan.safetensors")]) == 0
    os.remove(dst / "vqgan.ckpt")
    m = specar.load_model(str(dst), **WIDE)
    codes = torch.tensor([[[0, 1, 2, 3], [3, 2, 1, 0]]])
    assert torch.equal(m.vqgan(codes), mdl.vqgan(codes))


def test_unsafe_pickle_is_refused_naming_the_file(tiny, tmp_path):
    dst = _copy(tiny, tmp_path)
    ck = torch.load(dst / "vqgan.ckpt", weights_only=True)
    ck["callbacks"] = NotATensor()
    torch.save(ck, dst / "vqgan.ckpt")
    with pytest.raises(ValueError, match=r"vqgan.ckpt cannot be loaded safely.*weights_only"):
        specar.load_model(str(dst), **WIDE)


def test_bad_folders_and_mismatched_weights(tiny, tmp_path):
    for missing in ("vqgan.yaml", "vqgan.ckpt", "tokenizer.json", "model.safetensors"):
        dst = _copy(tiny, tmp_path, f"no-{missing}")
        os.remove(dst / missing)
        with pytest.raises(ValueError, match=missing.replace(".", r"\.")):
            specar.load_model(str(dst), **WIDE)
    dst = _copy(tiny, tmp_path, "decoder-shape")
    (dst / "vqgan.yaml").write_text(vqgan_yaml(dict(VQGAN, ch=64)))
    with pytest.raises(ValueError, match=r"vqgan\.ckpt do not match"):
        specar.load_model(str(dst), **WIDE)
    dst = _copy(tiny, tmp_path, "codebook")
    (dst / "vqgan.yaml").write_text(vqgan_yaml(dict(VQGAN, n_embed=8)))
    with pytest.raises(ValueError, match=r"config.json.*8|vqgan\.ckpt"):
        specar.load_model(str(dst), **WIDE)
    dst = _copy(tiny, tmp_path, "layers")
    cfg = json.loads((dst / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="model.safetensors"):
        specar.load_model(str(dst), **WIDE)


def test_bad_options(tiny):
    with pytest.raises(ValueError, match="resolution '48x48'.*64x64"):
        specar.load_model(tiny[0], layout="lumina", target_size=64, resolution="48x48")
    with pytest.raises(ValueError, match="layout"):
        specar.load_model(tiny[0], layout="emu")
    with pytest.raises(ValueError, match="anole layout"):
        specar.load_model(tiny[0], layout="anole", resolution="512x512")


def test_device_auto_loads_on_the_gpu_if_any_else_the_cpu(tiny):
    want = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert specar.load_model(tiny[0], device="auto", **WIDE).device.type == want.type
