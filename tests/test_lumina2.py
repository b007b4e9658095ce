"""Lumina-mGPT 2.0 adapter (our own decoder and MoVQGAN decoder) on a tiny random-weight checkpoint
saved in the released folder's format: ``config.json`` with the keys of the authors'
``ChameleonXLLMXConfig`` (model_type chameleon), the weights sharded as
``model-0000N-of-00002.safetensors`` + ``model.safetensors.index.json`` under the authors' tensor
names (``model.layers.N.self_attn.q_norm.weight`` of shape [model_parallel_size, head_dim], ...),
image codes at vocabulary ids 155000 + code, a ``tokenizer.json`` / ``tokenizer_config.json`` with
the layout's special tokens (no bos token, as a Qwen-style tokenizer), and ``movqgan_270M.ckpt``
as ai-forever ships it (a plain state dict, encoder included) at tiny widths.

Reference generation: an independent plain loop in this file that follows the authors' code
literally (full recomputation without cache; the cond row from BOS, the uncond row from the
image-start token, each at positions from 0; their q/k norm as layer norm plus the group's weight
and bias repeated per head; rotate-half rotary; CFG ``s * (cond - uncond) + uncond`` on the logits,
then only image ids allowed; the newline forced where their ``MultiModalLogitsProcessor`` forces
it) and a literal MoVQGAN decoder written from the state dict; transformers' own Chameleon class (one
q/k norm group per head, its layout); and, opt-in, the authors' code when ``LUMINA2_REPO`` points at a
checkout of github.com/Alpha-VLLM/Lumina-mGPT-2.0 (their decoder layers and their MoVQGAN decoder on the
same weights).
"""
import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F

import specar
from support.conformance import check_conformance
from specar.model_loaders.families.lumina2 import IMAGE_TOKEN_OFFSET, is_lumina2
from specar.model_loaders.families.lumina2_vq import MoVQDecoder
from specar.model_loaders.registry import FAMILIES, detect_family
from specar.model_loaders.resolutions import load_options
from support.exactness import reused_cache_differences
from support.calls import generate_kwargs

DIM, HEADS, KV, GROUPS, LAYERS, FFN, CODES = 32, 4, 2, 2, 2, 64, 8
VOCAB = IMAGE_TOKEN_OFFSET + CODES + 8  # the image codes are not the last ids (the real vocabulary pads past them)
VQ = dict(n_embed=CODES, embed_dim=4, z_channels=4, widths=[32, 32, 32, 32], n_blocks=2, attn_levels=(3,))
WIDE = dict(target_size=64, resolution="128x32")  # 4 rows of 16 codes, each followed by the newline
PROMPT = "a red cat"
WORDS = ["<unk>", "a", "red", "blue", "cat", "dog", "on", "the", "grass", "blurry", "Generate", "an", "image", "of",
         "according", "to", "following", "prompt", ":", "32x32", "128x32", "64x64", "32x128"]
SPECIALS = ["<|endoftext|>", "<racm3:break>", "<eoss>", "<reserved08796>", "<reserved08797>", "<reserved08798>",
            "<reserved08799>", "<reserved08706>"] + [f"<reserved{8800 + n:05d}>" for n in range(1, 5)]


def decoder_state(seed=0):
    g = torch.Generator().manual_seed(seed)
    sd = {"model.embed_tokens.weight": torch.randn(VOCAB, DIM, generator=g),
          "model.norm.weight": 1 + 0.1 * torch.randn(DIM, generator=g),
          "lm_head.weight": 3 * torch.randn(VOCAB, DIM, generator=g) * DIM ** -0.5}
    hd = DIM // HEADS
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for name, shape in (("self_attn.q_proj", (DIM, DIM)), ("self_attn.k_proj", (KV * hd, DIM)),
                            ("self_attn.v_proj", (KV * hd, DIM)), ("self_attn.o_proj", (DIM, DIM)),
                            ("mlp.gate_proj", (FFN, DIM)), ("mlp.up_proj", (FFN, DIM)), ("mlp.down_proj", (DIM, FFN))):
            sd[p + name + ".weight"] = torch.randn(shape, generator=g) * shape[1] ** -0.5
        for name in ("self_attn.q_norm", "self_attn.k_norm"):
            sd[p + name + ".weight"] = 1 + 0.2 * torch.randn(GROUPS, hd, generator=g)
            sd[p + name + ".bias"] = 0.2 * torch.randn(GROUPS, hd, generator=g)
        for name in ("input_layernorm", "post_attention_layernorm"):
            sd[p + name + ".weight"] = 1 + 0.1 * torch.randn(DIM, generator=g)
    return sd


def config(**over):
    """config.json as the authors' ChameleonXLLMXConfig writes it (their configuration_chameleon.py keys)."""
    cfg = dict(architectures=["ChameleonXLLMXForConditionalGeneration"], model_type="chameleon", vocab_size=VOCAB,
               hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
               num_key_value_heads=KV, hidden_act="silu", max_position_embeddings=256, initializer_range=0.02,
               rms_norm_eps=1e-5, use_cache=True, pad_token_id=None, bos_token_id=None, eos_token_id=0,
               tie_word_embeddings=False, rope_theta=10000.0, rope_scaling=None, attention_bias=False,
               attention_dropout=0.0, model_parallel_size=GROUPS, swin_norm=False, mlp_bias=False,
               mask_image_logits=False, dropout=0.05, z_loss_weight=1e-5, torch_dtype="bfloat16",
               vq_config=dict(embed_dim=256, num_embeddings=8192, resolution=512), vocabulary_map=None)
    cfg.update(over)
    return cfg


def write_weights(folder, sd):
    """Two shards and their index, as save_pretrained writes a large checkpoint."""
    from safetensors.torch import save_file
    keys = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for name, ks in shards.items():
        save_file({k: sd[k].contiguous() for k in ks}, os.path.join(folder, name), metadata={"format": "pt"})
    index = {"metadata": {"total_size": sum(v.numel() * 4 for v in sd.values())},
             "weight_map": {k: name for name, ks in shards.items() for k in ks}}
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)


def movq_state(seed=1):
    torch.manual_seed(seed)
    dec = MoVQDecoder(**VQ)
    g = torch.Generator().manual_seed(seed)
    sd = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in dec.state_dict().items()}
    sd["encoder.conv_in.weight"] = torch.zeros(32, 3, 3, 3)  # the tokenizer's encoder: not used for decoding
    sd["quant_conv.weight"] = torch.zeros(4, 4, 1, 1)
    return sd


def build(folder, cfg=None, sd=None):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    os.makedirs(folder, exist_ok=True)
    tk = Tokenizer(models.WordLevel({w: i + len(SPECIALS) for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens(SPECIALS)  # ids 0.. (the real ones sit at 151643..; looked up by name)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", unk_token="<unk>")
    tok.save_pretrained(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg or config(), f)
    sd = sd or decoder_state()
    write_weights(folder, sd)
    torch.save(movq_state(), os.path.join(folder, "movqgan_270M.ckpt"))
    return sd, tok


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("lumina2") / "Lumina-mGPT-2.0-tiny")
    sd, tok = build(folder)
    return folder, sd, tok, specar.load_model(folder, **WIDE)


# -- the authors' computation, written out literally ----------------------------------------------
def ref_logits(sd, ids):
    """Logits [vocab] of the last position of `ids` (positions 0..L-1, no cache)."""
    hd, L = DIM // HEADS, len(ids)
    x = sd["model.embed_tokens.weight"][torch.tensor(ids)]
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
    freqs = torch.arange(L).float()[:, None] * inv
    cos, sin = torch.cat([freqs, freqs], -1).cos()[:, None], torch.cat([freqs, freqs], -1).sin()[:, None]

    def rms(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def qk_norm(t, p, heads):  # [L, heads, hd]: layer norm, then the group's weight / bias per head
        t = F.layer_norm(t, (hd,), eps=1e-5)
        return t * sd[p + ".weight"].repeat_interleave(heads // GROUPS, 0) + \
            sd[p + ".bias"].repeat_interleave(heads // GROUPS, 0)

    def rope(t):
        return t * cos + torch.cat([-t[..., hd // 2:], t[..., : hd // 2]], -1) * sin

    for i in range(LAYERS):
        p = f"model.layers.{i}."
        h = rms(x, sd[p + "input_layernorm.weight"])
        q = rope(qk_norm((h @ sd[p + "self_attn.q_proj.weight"].T).view(L, HEADS, hd), p + "self_attn.q_norm", HEADS))
        k = rope(qk_norm((h @ sd[p + "self_attn.k_proj.weight"].T).view(L, KV, hd), p + "self_attn.k_norm", KV))
        v = (h @ sd[p + "self_attn.v_proj.weight"].T).view(L, KV, hd)
        k, v = k.repeat_interleave(HEADS // KV, 1), v.repeat_interleave(HEADS // KV, 1)
        att = torch.einsum("ihd,jhd->hij", q, k) / hd ** 0.5
        att = att.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
        x = x + torch.einsum("hij,jhd->ihd", att, v).reshape(L, DIM) @ sd[p + "self_attn.o_proj.weight"].T
        h = rms(x, sd[p + "post_attention_layernorm.weight"])
        x = x + (F.silu(h @ sd[p + "mlp.gate_proj.weight"].T) * (h @ sd[p + "mlp.up_proj.weight"].T)) \
            @ sd[p + "mlp.down_proj.weight"].T
    return rms(x, sd["model.norm.weight"])[-1] @ sd["lm_head.weight"].T


def ref_greedy(sd, cond, uncond, H, W, newline, scale):
    out = []
    image = torch.zeros(VOCAB, dtype=torch.bool)
    image[IMAGE_TOKEN_OFFSET: IMAGE_TOKEN_OFFSET + CODES] = True
    for k in range(H * (W + 1)):
        if (k + 1) % (W + 1) == 0:
            out.append(newline)
            continue
        c, u = ref_logits(sd, cond + out), ref_logits(sd, uncond + out)
        out.append(int((scale * (c - u) + u).masked_fill(~image, float("-inf")).argmax()))
    return out


def ref_movq(sd, codes):
    """MoVQGAN's decode_code for codes [H, W], from the state dict."""
    def snorm(f, p, zq):
        zq = F.interpolate(zq, size=f.shape[-2:], mode="nearest")
        f = F.group_norm(f, 32, sd[p + ".norm_layer.weight"], sd[p + ".norm_layer.bias"], eps=1e-6)
        return f * F.conv2d(zq, sd[p + ".conv_y.weight"], sd[p + ".conv_y.bias"]) + \
            F.conv2d(zq, sd[p + ".conv_b.weight"], sd[p + ".conv_b.bias"])

    def conv(h, p, pad=1):
        return F.conv2d(h, sd[p + ".weight"], sd[p + ".bias"], padding=pad)

    def res(h, p, zq):
        t = conv(F.silu(snorm(h, p + ".norm1", zq)), p + ".conv1")
        t = conv(F.silu(snorm(t, p + ".norm2", zq)), p + ".conv2")
        return (conv(h, p + ".nin_shortcut", 0) if p + ".nin_shortcut.weight" in sd else h) + t

    def attn(h, p, zq):
        B, C, Hh, Ww = h.shape
        t = snorm(h, p + ".norm", zq)
        q, k, v = (conv(t, f"{p}.{n}", 0).reshape(C, -1) for n in "qkv")
        w = (q.T @ k * C ** -0.5).softmax(-1)  # [query, key]
        return h + conv((v @ w.T).reshape(1, C, Hh, Ww), p + ".proj_out", 0)

    zq = sd["quantize.embedding.weight"][codes].permute(2, 0, 1)[None]
    h = conv(conv(zq, "post_quant_conv", 0), "decoder.conv_in")
    h = res(attn(res(h, "decoder.mid.block_1", zq), "decoder.mid.attn_1", zq), "decoder.mid.block_2", zq)
    for lvl in (3, 2, 1, 0):
        for b in range(VQ["n_blocks"]):
            h = res(h, f"decoder.up.{lvl}.block.{b}", zq)
            if lvl in VQ["attn_levels"]:
                h = attn(h, f"decoder.up.{lvl}.attn.{b}", zq)
        if lvl:
            h = conv(F.interpolate(h, scale_factor=2.0, mode="nearest"), f"decoder.up.{lvl}.upsample.conv")
    return conv(F.silu(snorm(h, "decoder.norm_out", zq)), "decoder.conv_out")[0]


# -- tests --------------------------------------------------------------------------------------------
def test_detected_loaded_prompt_layout_and_defaults(tiny):
    folder, sd, tok, m = tiny
    assert detect_family(folder) == "lumina2" and m.family == "lumina2"
    g = m.geometry
    assert (g.height, g.width, g.vocab_size, g.row_end) == (4, 16, CODES, True)
    assert m.default_sampling == {"cfg_scale": 4.0, "top_k": CODES}  # the authors' top-k 4096, capped at 8 codes
    v = tok.get_vocab()
    size = [v["<reserved08801>"], v["<reserved08804>"]]  # height 32 px = 1 patch first, then width 128 px = 4
    body = tok("Generate an image of 128x32 according to the following prompt:\na red cat",
               add_special_tokens=False).input_ids
    enc = m.encode_prompt(PROMPT)
    assert v["<unk>"] not in body
    # no bos token: the authors' Tokenizer starts with eos instead
    assert enc.cond == [tok.eos_token_id] + body + [v["<reserved08706>"], v["<racm3:break>"]] + size
    assert enc.uncond == [v["<racm3:break>"]] + size
    assert m.encode_prompt(PROMPT, "blurry").uncond[-4:] == [v["<reserved08706>"], v["<racm3:break>"]] + size
    # the image head holds the image rows of lm_head only
    assert torch.equal(m.net.lm_head.weight, sd["lm_head.weight"][IMAGE_TOKEN_OFFSET:IMAGE_TOKEN_OFFSET + CODES])
    assert not is_lumina2(folder, config(vocab_size=65536))  # Lumina-mGPT 1 / Anole stay with the chameleon family


@pytest.mark.parametrize("text,negative", [(PROMPT, ""), ("blue dog on the grass", "blurry")])
def test_ar_reproduces_the_authors_computation(tiny, text, negative):
    folder, sd, tok, m = tiny
    enc = m.encode_prompt(text, negative)
    newline = tok.get_vocab()["<reserved08799>"]
    ref = ref_greedy(sd, enc.cond, enc.uncond, 4, 16, newline, 4.0)
    res = specar.generate(m, text, negative_prompt=negative, backend="ar", sampling=dict(temperature=0, cfg_scale=4.0))
    ids = m.to_model_ids(res.sequence)[0]
    assert ids[:-1].tolist() == ref and int(ids[-1]) == tok.get_vocab()["<eoss>"]
    pix = ref_movq(torch.load(os.path.join(folder, "movqgan_270M.ckpt"), weights_only=True), res.tokens)
    assert res.image.size == (128, 32) and pix.shape == (3, 32, 128)
    expected = ((pix.permute(1, 2, 0).clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    got = torch.tensor(list(res.image.tobytes()), dtype=torch.uint8).view(expected.shape)
    assert (got.int() - expected.int()).abs().max() <= 1  # float rounding at .5 boundaries only


@pytest.mark.parametrize("swin", [False, True])
def test_decoder_equals_transformers_chameleon_with_one_norm_group_per_head(tmp_path, swin):
    """transformers' Chameleon stores one q/k norm per head: the authors' format with model_parallel_size =
    heads (and as many key/value heads); with it our decoder must give transformers' logits, in both norm
    placements (swin_norm)."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration
    hf_cfg = ChameleonConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS,
                             num_attention_heads=HEADS, num_key_value_heads=HEADS, swin_norm=swin,
                             vocabulary_map={"<image>": len(SPECIALS)},
                             vq_config=dict(embed_dim=4, num_embeddings=4, latent_channels=4, resolution=32,
                                            base_channels=32, channel_multiplier=[1, 1], num_res_blocks=1))
    torch.manual_seed(0)
    hf = ChameleonForConditionalGeneration(hf_cfg).eval()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "vqmodel" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 if p.dim() < 2 or "embed" in name else
                                                             p.shape[-1] ** -0.5))
    sd = {k: v.clone() for k, v in hf.state_dict().items() if not k.startswith("model.vqmodel.")}
    folder = str(tmp_path / "from-transformers")
    build(folder, cfg=config(num_key_value_heads=HEADS, model_parallel_size=HEADS, swin_norm=swin), sd=sd)
    m = specar.load_model(folder, **WIDE)
    enc = m.encode_prompt(PROMPT)
    tokens = torch.randint(CODES + 1, (1, 20), generator=g)  # image codes and the newline (engine id CODES)
    s = m.start(enc, 1, False, draft_capacity=20)
    out = m.forward(s, tokens, list(range(-1, 19)))
    ids = torch.tensor([enc.cond + m.to_model_ids(tokens)[0, :-1].tolist()])
    with torch.no_grad():
        ref = hf.lm_head(hf.model(input_ids=ids).last_hidden_state[0])[:, IMAGE_TOKEN_OFFSET:IMAGE_TOKEN_OFFSET + CODES]
    P = len(enc.cond)
    assert torch.allclose(s.first.cond[0, 0], ref[P - 1], atol=1e-4)
    assert torch.allclose(out.cond[0], ref[P:], atol=1e-4)


def test_adapter_conformance(tiny):
    check_conformance(tiny[3])


@pytest.mark.parametrize("backend", list(specar.BACKENDS))
def test_every_backend_end_to_end(tiny, backend, monkeypatch):
    m = tiny[3]  # hawk / adt_tree / spatial: random-weight drafters (no trained files for a random tiny model)
    monkeypatch.setattr(m, "random_drafter_seed", 0, raising=False)
    H, W = m.geometry.height, m.geometry.width
    res = specar.generate(m, PROMPT, backend=backend, seed=3, batch_size=2, negative_prompt="blurry")
    assert res.tokens.shape == (2, H, W) and all(im.size == (128, 32) for im in res.images)
    seq = res.sequence.cpu()
    assert (seq[:, W::W + 1] == CODES).all() and (seq.view(2, H, W + 1)[:, :, :W] < CODES).all()
    assert res.stats.forced_tokens == H  # one newline per row, filled in by the engine


def test_sizes_offered_and_refused(tiny):
    folder = tiny[0]
    family = FAMILIES["lumina2"]
    assert load_options(folder, "768x768") == {"resolution": "768x768"}
    assert load_options(folder, "1024x576") == {"resolution": "1024x576"}
    with pytest.raises(ValueError, match=r"does not offer 512x512; it offers \(WxH\) 1536x384, .*768x768"):
        family.size_options(folder, 512, 512)
    # the authors' generate_crop_size_list for 4 patches, walked by hand: (4, 1), (3, 1), (2, 1), (2, 2), (1, 2), ...
    with pytest.raises(ValueError, match=r"resolution '160x32' is not a Lumina-mGPT 2.0 size for target_size 64; "
                                         r"allowed \(WxH\): 128x32, 96x32, 64x32, 64x64, 32x64, 32x96, 32x128$"):
        specar.load_model(folder, target_size=64, resolution="160x32")
    with pytest.raises(ValueError, match="target_size must be a multiple of 32"):
        specar.load_model(folder, target_size=50)
    m = specar.load_model(folder, target_size=32)  # 32x32 px: 4x4 codes
    assert (m.geometry.height, m.geometry.width) == (4, 4)
    assert specar.generate(m, PROMPT, backend="sjd", seed=0).image.size == (32, 32)


def _copy(tiny, tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(tiny[0], dst)
    return dst


def test_corrupt_and_mismatched_files(tiny, tmp_path):
    dst = _copy(tiny, tmp_path, "truncated")
    shard = dst / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(ValueError, match=r"model-00002-of-00002\.safetensors is not a valid safetensors file"):
        specar.load_model(str(dst), **WIDE)

    dst = _copy(tiny, tmp_path, "mismatch")  # config says 3 layers, the weights hold 2
    (dst / "config.json").write_text(json.dumps(config(num_hidden_layers=3)))
    with pytest.raises(ValueError, match=r"model\.safetensors\.index\.json do not match .*config\.json: missing "
                                         r"\(\d+\): model\.layers\.2\."):
        specar.load_model(str(dst), **WIDE)

    dst = _copy(tiny, tmp_path, "shape")  # a q/k norm stored per head, not per model-parallel group
    sd = decoder_state()
    sd["model.layers.1.self_attn.q_norm.weight"] = torch.ones(HEADS, DIM // HEADS)
    for f in dst.glob("model-*.safetensors"):
        f.unlink()
    write_weights(str(dst), sd)
    with pytest.raises(ValueError, match=r"wrong shape \(1\): model\.layers\.1\.self_attn\.q_norm\.weight \(4, 8\) "
                                         r"vs \(2, 8\)"):
        specar.load_model(str(dst), **WIDE)

    dst = _copy(tiny, tmp_path, "novq")
    (dst / "movqgan_270M.ckpt").unlink()
    with pytest.raises(ValueError, match="movqgan_270M.safetensors or movqgan_270M.ckpt is missing"):
        specar.load_model(str(dst), **WIDE)

    dst = _copy(tiny, tmp_path, "smallvocab")  # fewer ids than the image codes need
    (dst / "config.json").write_text(json.dumps(config(vocab_size=IMAGE_TOKEN_OFFSET + 4)))
    with pytest.raises(ValueError, match=r"vocab_size 155004 has no room for the 8 image codes"):
        specar.load_model(str(dst), **WIDE)

    dst = _copy(tiny, tmp_path, "tied")  # tie_word_embeddings: no lm_head tensor, the head is the embedding
    (dst / "config.json").write_text(json.dumps(config(tie_word_embeddings=True)))
    sd = decoder_state()
    del sd["lm_head.weight"]
    for f in dst.glob("model-*.safetensors"):
        f.unlink()
    write_weights(str(dst), sd)
    tied = specar.load_model(str(dst), **WIDE)
    assert torch.equal(tied.net.lm_head.weight, sd["model.embed_tokens.weight"][IMAGE_TOKEN_OFFSET:][:CODES])

    dst = _copy(tiny, tmp_path, "badvq")  # a plain VQGAN (no spatial norms) where MoVQGAN belongs
    state = torch.load(dst / "movqgan_270M.ckpt", weights_only=True)
    state = {k.replace(".norm_layer.", "."): v for k, v in state.items() if ".conv_y." not in k and ".conv_b." not in k}
    torch.save(state, dst / "movqgan_270M.ckpt")
    with pytest.raises(ValueError, match=r"movqgan_270M\.ckpt is not a MoVQGAN image tokenizer checkpoint"):
        specar.load_model(str(dst), **WIDE)


@pytest.mark.skipif(not os.environ.get("SPECAR_COMPILE_TESTS"),
                    reason="opt-in (about a minute of torch.compile on a CPU): set SPECAR_COMPILE_TESTS=1")
def test_compiled_step_matches_eager(tiny):
    folder, _, _, eager = tiny
    comp = specar.load_model(folder, **WIDE)
    kw = dict(backend="sjd_pac", seed=21, batch_size=2, window=3, tree_depth=2, tree_width=2)
    want = specar.generate(eager, PROMPT, **generate_kwargs(**kw))
    got = specar.generate(comp, PROMPT, **generate_kwargs(compile=True, **kw))
    assert torch.equal(got.tokens, want.tokens)
    st = got.stats.compile
    assert st["eager_fallback"] == "" and st["graph_breaks"] == 0 and st["recompiles"] == 0


# -- opt-in: the authors' MoVQGAN decoder on the same weights ------------------------------------------
REPO = os.environ.get("LUMINA2_REPO")


@pytest.mark.skipif(not REPO, reason="set LUMINA2_REPO to a checkout of Alpha-VLLM/Lumina-mGPT-2.0")
def test_movqgan_decoder_against_the_authors_code(tmp_path):
    """Their MOVQDecoder (lumina_mgpt/movqgan/modules/vqvae/movq_modules.py, torch only) at the 270M model's
    settings (their movqgan/__init__.py MODELS['270M']), random weights, saved as their checkpoint is (a plain
    state dict), decoded by our loader: the same pixels. (Their transformer code needs transformers 4.4x.)"""
    import importlib.util
    from specar.model_loaders.families.lumina2_vq import load_movqgan
    spec = importlib.util.spec_from_file_location(
        "movq_modules", os.path.join(REPO, "lumina_mgpt", "movqgan", "modules", "vqvae", "movq_modules.py"))
    movq = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(movq)
    torch.manual_seed(0)
    theirs = movq.MOVQDecoder(ch=256, out_ch=3, ch_mult=[1, 2, 2, 4], num_res_blocks=2, attn_resolutions=[32],
                              dropout=0.0, in_channels=3, resolution=256, z_channels=4, zq_ch=4).eval()
    embedding, post_quant_conv = torch.nn.Embedding(16384, 4), torch.nn.Conv2d(4, 4, 1)
    with torch.no_grad():
        for p in theirs.parameters():  # away from the identity init of the norms
            p.add_(0.05 * torch.randn(p.shape))
    state = {"quantize.embedding.weight": embedding.weight.detach(),
             **{"post_quant_conv." + k: v for k, v in post_quant_conv.state_dict().items()},
             **{"decoder." + k: v for k, v in theirs.state_dict().items()}}
    torch.save(state, tmp_path / "movqgan_270M.ckpt")
    ours = load_movqgan(str(tmp_path / "movqgan_270M.ckpt"))
    assert ours.downsample == 8 and ours.quantize.embedding.weight.shape == (16384, 4)
    codes = torch.randint(16384, (3, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # their decode_code: embedding, view (1, h, w, 4), post_quant_conv, decoder(z, zq)
        zq = embedding(codes.flatten()).view(1, 3, 5, 4).permute(0, 3, 1, 2).contiguous()
        ref = theirs(post_quant_conv(zq), zq)
        got = ours(codes[None])
    assert got.shape == ref.shape == (1, 3, 24, 40)
    assert torch.allclose(got, ref, atol=1e-4)


def _authors_layers(repo, tmp_path):
    """The authors' decoder-layer classes (eager attention), taken from their modeling_chameleon.py by name:
    the file as a whole imports transformers 4.4x internals, these classes need torch and ACT2FN only."""
    import ast
    import importlib.util
    path = os.path.join(repo, "lumina_mgpt", "model", "chameleon", "modeling_chameleon.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    wanted = {"ChameleonRMSNorm", "ChameleonRotaryEmbedding", "rotate_half", "apply_rotary_pos_emb", "ChameleonMLP",
              "ChameleonLayerNorm", "repeat_kv", "ChameleonAttention", "ChameleonDecoderLayer",
              "ChameleonSwinDecoderLayer"}
    body = [n for n in tree.body if getattr(n, "name", None) in wanted]
    assert {n.name for n in body} == wanted
    # the classes in a module of their own, beside the names they use (no exec: the Registry's scan refuses it)
    module = os.path.join(str(tmp_path), "authors_chameleon_layers.py")
    with open(module, "w", encoding="utf-8") as f:
        f.write("import math\nfrom types import SimpleNamespace\nfrom typing import Optional, Tuple\n"
                "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n"
                "from transformers.activations import ACT2FN\n"
                "Cache = ChameleonConfig = object\nlogger = SimpleNamespace(warning_once=print)\n\n"
                + ast.unparse(ast.Module(body=body, type_ignores=[])) + "\n")
    spec = importlib.util.spec_from_file_location("authors_chameleon_layers", module)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    ns = vars(loaded)
    ns["CHAMELEON_ATTENTION_CLASSES"] = {"eager": ns["ChameleonAttention"]}
    return ns


@pytest.mark.skipif(not REPO, reason="set LUMINA2_REPO to a checkout of Alpha-VLLM/Lumina-mGPT-2.0")
@pytest.mark.parametrize("swin", [False, True])
def test_decoder_against_the_authors_layers(tiny, tmp_path, swin):
    """Their decoder layers (grouped q/k norms, GQA, rotary, both norm placements) loaded with the tiny
    checkpoint's tensors, stacked as their ChameleonModel does: the same logits as our model."""
    from types import SimpleNamespace
    ns = _authors_layers(REPO, tmp_path)
    folder = str(tmp_path / "swin" if swin else tmp_path / "plain")
    sd, _ = build(folder, cfg=config(swin_norm=swin))
    m = specar.load_model(folder, **WIDE)
    c = SimpleNamespace(**config(swin_norm=swin), _attn_implementation="eager")
    cls = ns["ChameleonSwinDecoderLayer"] if swin else ns["ChameleonDecoderLayer"]
    layers = [cls(c, i).eval() for i in range(LAYERS)]
    for i, layer in enumerate(layers):
        p = f"model.layers.{i}."
        layer.load_state_dict({k[len(p):]: v for k, v in sd.items() if k.startswith(p)})
    enc = m.encode_prompt(PROMPT)
    tokens = torch.randint(CODES + 1, (1, 20), generator=torch.Generator().manual_seed(2))
    ids = torch.tensor([enc.cond + m.to_model_ids(tokens)[0, :-1].tolist()])
    L = ids.shape[1]
    mask = torch.full((L, L), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        h = sd["model.embed_tokens.weight"][ids]
        for layer in layers:
            h = layer(h, attention_mask=mask, position_ids=torch.arange(L)[None])[0]
        h = ns["ChameleonRMSNorm"](DIM, 1e-5)(h)  # weight: ones, then theirs
        h = h * sd["model.norm.weight"]
        ref = (h @ sd["lm_head.weight"].T)[0, :, IMAGE_TOKEN_OFFSET:IMAGE_TOKEN_OFFSET + CODES]
    s = m.start(enc, 1, False, draft_capacity=20)
    out = m.forward(s, tokens, list(range(-1, 19)))
    P = len(enc.cond)
    assert torch.allclose(s.first.cond[0, 0], ref[P - 1], atol=1e-4)
    assert torch.allclose(out.cond[0], ref[P:], atol=1e-4)


def test_quantized_int4_weights_generate_and_stay_exact_to_their_own_ar(tiny):
    """quantize='int4': the decoder's linear layers become QuantLinear (the image head stays as stored), and a
    speculative backend gives the quantized model's own AR image (same image as AR, the default mode)."""
    from specar.model_loaders.precision.quantize import QuantLinear
    folder = tiny[0]
    m = specar.load_model(folder, quantize="int4", **WIDE)
    kinds = {type(mod).__name__ for name, mod in m.net.named_modules() if "lm_head" not in name}
    assert "QuantLinear" in kinds and "Linear" not in kinds
    assert not isinstance(m.net.lm_head, QuantLinear)
    ar = specar.generate(m, PROMPT, backend="ar", seed=5)
    sjd = specar.generate(m, PROMPT, backend="sjd", seed=5)
    assert torch.equal(ar.tokens, sjd.tokens) and sjd.stats.nfe <= ar.stats.nfe


def test_a_compiled_sessions_cache_is_reused_unseen(tiny):
    # the CUDA-graph path keeps one KV cache per model (slot_model._session_cache): reset_cache zeroes its SlotKV
    assert reused_cache_differences(tiny[3], [PROMPT, "a very long prompt about a small red cat in the snow"]) \
        == ([], True)


def test_device_auto_loads_on_the_gpu_if_any_else_the_cpu(tiny):
    want = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert specar.load_model(tiny[0], device="auto", **WIDE).device.type == want.type
