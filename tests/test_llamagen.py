"""LlamaGen adapter (our own GPT and VQ decoder) on tiny random-weight checkpoints saved in the
authors' format: ``c2i_*_<size>.pt`` / ``t2i_*_<size>.pt`` (weights under ``model``, the authors'
parameter names), ``vq_ds16_*.pt`` (under ``model``, encoder weights included) and, for t2i, a
tiny `T5EncoderModel` saved with ``save_pretrained`` in ``flan-t5-xl/``.

Reference generation: LlamaGen has no transformers implementation, so `ar` is compared with
(1) an independent plain loop in this file that follows the authors' ``generate`` literally
(full recomputation without cache over the padded 120-token condition with the caption mask,
zero rotary rows for condition tokens, complex-number 2D rotary embeddings, CFG on logits) and
(2) the authors' own code when ``LLAMAGEN_REPO`` points at a checkout of
github.com/FoundationVision/LlamaGen (opt-in: logits and decoded pixels on the same weights).
"""
import math
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F

import specar
from support.conformance import check_commit_path, check_hidden_states, check_per_row_trees, \
    check_tree_forward
from specar.model_loaders.families.llamagen_vq import LlamaGenVQDecoder
from support.exactness import reused_cache_differences

TOL = 1e-5
DIM, HEADS, KV, LAYERS, FFN, CODES, CLASSES, CAP = 32, 4, 2, 2, 128, 16, 10, 16  # FFN: the authors' SwiGLU width for dim 32, multiple_of 128
VQ = dict(codebook_size=CODES, codebook_dim=8, z_channels=32, widths=[32] * 5, blocks_per_level=2)


class NotATensor:
    pass


def gpt_state(kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) * (s[-1] ** -0.5 if len(s) > 1 else 1)  # noqa: E731
    hd = DIM // HEADS
    sd = {"tok_embeddings.weight": torch.randn(CODES, DIM, generator=g), "norm.weight": 1 + 0.1 * r(DIM),
          "output.weight": 3 * r(CODES, DIM)}
    if kind == "c2i":
        sd["cls_embedding.embedding_table.weight"] = torch.randn(CLASSES + 1, DIM, generator=g)
    else:
        sd["cls_embedding.cap_proj.fc1.weight"] = r(DIM, CAP)
        sd["cls_embedding.cap_proj.fc2.weight"] = r(DIM, DIM)
        sd["cls_embedding.uncond_embedding"] = torch.randn(120, CAP, generator=g) * CAP ** -0.5
    for i in range(LAYERS):
        p = f"layers.{i}."
        sd.update({p + "attention.wqkv.weight": r((HEADS + 2 * KV) * hd, DIM), p + "attention.wo.weight": r(DIM, DIM),
                   p + "feed_forward.w1.weight": r(FFN, DIM), p + "feed_forward.w3.weight": r(FFN, DIM),
                   p + "feed_forward.w2.weight": r(DIM, FFN), p + "attention_norm.weight": 1 + 0.1 * r(DIM),
                   p + "ffn_norm.weight": 1 + 0.1 * r(DIM)})
    return sd


def vq_state(seed=1):
    torch.manual_seed(seed)
    dec = LlamaGenVQDecoder(**VQ)
    sd = {k: v + 0.05 * torch.randn(v.shape) for k, v in dec.state_dict().items()}
    sd["encoder.conv_in.weight"] = torch.zeros(32, 3, 3, 3)  # the tokenizer's encoder: not used
    sd["quant_conv.weight"] = torch.zeros(8, 32, 1, 1)
    return sd


def build_t5(folder):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

    words = ["<pad>", "</s>", "<unk>", "a", "red", "blue", "cat", "dog", "on", "the", "grass", "sky", "blurry"]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    torch.manual_seed(3)
    t5 = T5EncoderModel(T5Config(vocab_size=len(words), d_model=CAP, d_kv=4, d_ff=32, num_layers=1, num_heads=2,
                                 relative_attention_num_buckets=8, decoder_start_token_id=0)).eval()
    t5.save_pretrained(folder)
    tok.save_pretrained(folder)
    return t5, tok


@pytest.fixture(scope="module")
def c2i(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llamagen") / "LlamaGen-c2i-tiny"
    folder.mkdir()
    sd = gpt_state("c2i")
    torch.save({"model": sd, "steps": 3}, folder / "c2i_tiny_64.pt")  # 64 px / 16 = 4x4 codes
    torch.save({"model": vq_state()}, folder / "vq_ds16_c2i.pt")
    return str(folder), sd, specar.load_model(str(folder), n_head=HEADS)


@pytest.fixture(scope="module")
def t2i(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llamagen") / "LlamaGen-t2i-tiny"
    folder.mkdir()
    sd = gpt_state("t2i", seed=5)
    torch.save({"model": sd}, folder / "t2i_tiny_stage1_32.pt")  # 2x2 codes
    torch.save({"model": vq_state()}, folder / "vq_ds16_t2i.pt")
    t5, tok = build_t5(str(folder / "flan-t5-xl"))
    return str(folder), sd, specar.load_model(str(folder), n_head=HEADS), t5, tok


# -- the authors' generate, written out literally (no cache) ------------------------------------------
def ref_forward(sd, x, mask, n_cls, grid):
    """Logits [R, L, V] of embeddings x [R, L, D] under bool mask [R, L, L] (the authors' Transformer)."""
    hd = DIM // HEADS
    half = hd // 2
    freqs = 1.0 / (10000 ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    f = torch.outer(torch.arange(grid).float(), freqs)
    cells = torch.cat([f[:, None].expand(grid, grid, -1), f[None].expand(grid, grid, -1)], -1).flatten(0, 1)
    rot = torch.cat([torch.zeros(n_cls, half, dtype=torch.cfloat), torch.polar(torch.ones_like(cells), cells)])
    rot = rot[: x.shape[1]][None, :, None]  # zero rotation table for the condition tokens

    def rope(t):
        return torch.view_as_real(torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2)) * rot).flatten(3)

    def norm(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    R, L, _ = x.shape
    for i in range(LAYERS):
        p = f"layers.{i}."
        h = norm(x, sd[p + "attention_norm.weight"])
        q, k, v = (h @ sd[p + "attention.wqkv.weight"].T).split([DIM, KV * hd, KV * hd], -1)
        q, k = rope(q.view(R, L, HEADS, hd)), rope(k.view(R, L, KV, hd))
        k, v = k.repeat_interleave(HEADS // KV, 2), v.view(R, L, KV, hd).repeat_interleave(HEADS // KV, 2)
        att = torch.einsum("rihd,rjhd->rhij", q, k) / math.sqrt(hd)
        att = att.masked_fill(~mask[:, None], float("-inf")).softmax(-1)
        o = torch.einsum("rhij,rjhd->rihd", att, v).reshape(R, L, DIM)
        x = x + o @ sd[p + "attention.wo.weight"].T
        h = norm(x, sd[p + "ffn_norm.weight"])
        x = x + (F.silu(h @ sd[p + "feed_forward.w1.weight"].T) * (h @ sd[p + "feed_forward.w3.weight"].T)) \
            @ sd[p + "feed_forward.w2.weight"].T
    return norm(x, sd["norm.weight"]) @ sd["output.weight"].T


def ref_greedy(sd, cond, emb_mask, n_img, grid, scale):
    """cond [2, T, D] (cond and uncond rows), emb_mask [T] or None -> n_img greedy codes."""
    T = cond.shape[1]
    codes = []
    for _ in range(n_img):
        x = torch.cat([cond, sd["tok_embeddings.weight"][torch.tensor(codes, dtype=torch.long)].expand(2, -1, -1)], 1)
        L = x.shape[1]
        mask = torch.ones(L, L, dtype=torch.bool).tril()
        if emb_mask is not None:
            mask[:, :T] &= emb_mask[None]
            mask |= torch.eye(L, dtype=torch.bool)
        logits = ref_forward(sd, x, mask.expand(2, L, L), T, grid)[:, -1]
        codes.append(int((logits[1] + (logits[0] - logits[1]) * scale).argmax()))
    return codes


def test_c2i_loaded_geometry_prompt_and_defaults(c2i):
    folder, sd, m = c2i
    assert (m.geometry.height, m.geometry.width, m.geometry.vocab_size, m.geometry.row_end) == (4, 4, CODES, False)
    assert m.default_sampling == {"cfg_scale": 4.0, "top_k": CODES}
    assert m.encode_prompt("class:7").cond == [7] and m.encode_prompt(" 3 ").uncond == [CLASSES]
    for bad in ("a cat", "class:10", "-1"):
        with pytest.raises(ValueError, match="class index 0..9"):
            m.encode_prompt(bad)


@pytest.mark.parametrize("label", [0, 7])
def test_c2i_ar_reproduces_the_authors_generate(c2i, label):
    folder, sd, m = c2i
    cond = sd["cls_embedding.embedding_table.weight"][[label, CLASSES]][:, None]
    ref = ref_greedy(sd, cond, None, 16, 4, 4.0)
    res = specar.generate(m, f"class:{label}", backend="ar", sampling=dict(temperature=0, cfg_scale=4.0))
    assert res.tokens.flatten().tolist() == ref
    assert res.image.size == (64, 64)


@pytest.mark.parametrize("text", ["a red cat", "blue dog on the grass"])
def test_t2i_ar_reproduces_the_authors_generate(t2i, text):
    folder, sd, m, t5, tok = t2i
    ids = tok(text, max_length=120, padding="max_length", truncation=True, return_tensors="pt")
    with torch.no_grad():
        emb = t5(**ids).last_hidden_state[0]
    n = int(ids.attention_mask.sum())
    emb = torch.cat([emb[n:], emb[:n]]) * torch.flip(ids.attention_mask[0], [0])[:, None]  # the authors' left padding
    mask = torch.flip(ids.attention_mask[0], [0]).bool()

    def proj(c):
        return F.gelu(c @ sd["cls_embedding.cap_proj.fc1.weight"].T, approximate="tanh") @ \
            sd["cls_embedding.cap_proj.fc2.weight"].T

    cond = torch.stack([proj(emb), proj(sd["cls_embedding.uncond_embedding"])])
    ref = ref_greedy(sd, cond, mask, 4, 2, 7.5)
    res = specar.generate(m, text, backend="ar", sampling=dict(temperature=0, cfg_scale=7.5))
    assert res.tokens.flatten().tolist() == ref
    assert res.image.size == (32, 32)


@pytest.mark.parametrize("backend", list(specar.BACKENDS))
def test_every_backend_end_to_end(c2i, t2i, backend, monkeypatch):
    for m in (c2i[2], t2i[2],):  # hawk / adt_tree: random-weight drafters (no trained files for a random tiny model)
        monkeypatch.setattr(m, "random_drafter_seed", 0, raising=False)
    res = specar.generate(c2i[2], "class:3", backend=backend, seed=4, batch_size=2)
    assert res.tokens.shape == (2, 4, 4) and all(im.size == (64, 64) for im in res.images)
    res = specar.generate(t2i[2], "a red cat", backend=backend, seed=4, batch_size=2, negative_prompt="blurry")
    assert res.tokens.shape == (2, 2, 2) and all(im.size == (32, 32) for im in res.images)


@pytest.mark.parametrize("cfg", [False, True])
def test_adapter_conformance(c2i, t2i, cfg, monkeypatch):
    # the suite prompts with "a red cat"; a class-conditional model reads it as class 3
    m = c2i[2]
    encode = m.encode_prompt
    monkeypatch.setattr(m, "encode_prompt", lambda text, negative="": encode("class:3"))
    for check in (check_tree_forward, check_per_row_trees, check_commit_path, check_hidden_states):
        check(c2i[2], cfg, TOL)
    check_per_row_trees(t2i[2], cfg, TOL)
    check_commit_path(t2i[2], cfg, TOL)


def test_vq_decoder_uses_the_l2_normalised_codebook(c2i):
    m = c2i[2]
    codes = torch.tensor([[[1, 2], [3, 4]]])
    table = F.normalize(m.vq.quantize.embedding.weight, dim=-1)
    z = m.vq.post_quant_conv(table[codes].permute(0, 3, 1, 2))
    assert torch.allclose(m.vq.decoder.conv_in(z), m.vq.decoder.conv_in(
        m.vq.post_quant_conv(F.normalize(m.vq.quantize.embedding(codes), dim=-1).permute(0, 3, 1, 2))))


# -- files ---------------------------------------------------------------------------------------------
def _copy(src, tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def test_bad_folders_mismatched_and_unsafe_checkpoints(c2i, tmp_path):
    folder = c2i[0]
    dst = _copy(folder, tmp_path, "nogpt")
    os.remove(dst / "c2i_tiny_64.pt")
    with pytest.raises(ValueError, match="no supported model family"):
        specar.load_model(str(dst))
    dst = _copy(folder, tmp_path, "unsafe")
    ck = torch.load(dst / "vq_ds16_c2i.pt", weights_only=True)
    ck["args"] = NotATensor()
    torch.save(ck, dst / "vq_ds16_c2i.pt")
    with pytest.raises(ValueError, match=r"vq_ds16_c2i\.pt cannot be loaded safely"):
        specar.load_model(str(dst), n_head=HEADS)
    dst = _copy(folder, tmp_path, "mismatch")
    sd = torch.load(dst / "c2i_tiny_64.pt", weights_only=True)["model"]
    sd["layers.1.feed_forward.w2.weight"] = torch.zeros(DIM, FFN + 1)
    torch.save({"model": sd}, dst / "c2i_tiny_64.pt")
    with pytest.raises(ValueError, match=r"c2i_tiny_64\.pt do not match.*feed_forward.w2"):
        specar.load_model(str(dst), n_head=HEADS)
    with pytest.raises(ValueError, match=r"c2i_tiny_64\.pt: width 32.*n_head"):
        specar.load_model(folder)
    with pytest.raises(ValueError, match="image_size"):
        specar.load_model(folder, n_head=HEADS, image_size=40)


def test_safetensors_conversion_loads_the_same(c2i, tmp_path):
    from specar.__main__ import main
    dst = _copy(c2i[0], tmp_path, "converted")
    for n in ("c2i_tiny_64", "vq_ds16_c2i"):
        assert main(["convert-checkpoint", str(dst / f"{n}.pt"), str(dst / f"{n}.safetensors")]) == 0
        os.remove(dst / f"{n}.pt")
    m = specar.load_model(str(dst), n_head=HEADS)
    a = specar.generate(m, "class:2", backend="ar", sampling=dict(temperature=0, cfg_scale=4.0))
    b = specar.generate(c2i[2], "class:2", backend="ar", sampling=dict(temperature=0, cfg_scale=4.0))
    assert torch.equal(a.tokens, b.tokens)


def test_t2i_folder_without_t5(t2i, tmp_path):
    dst = _copy(t2i[0], tmp_path, "not5")
    shutil.rmtree(dst / "flan-t5-xl")
    with pytest.raises(ValueError, match="flan-t5-xl"):
        specar.load_model(str(dst), n_head=HEADS)


# -- opt-in: the authors' code on the same weights -------------------------------------------------------
REPO = os.environ.get("LLAMAGEN_REPO")


@pytest.mark.skipif(not REPO, reason="set LLAMAGEN_REPO to a checkout of FoundationVision/LlamaGen")
def test_against_the_authors_code(c2i, tmp_path):
    sys.path.insert(0, REPO)
    from autoregressive.models.gpt import ModelArgs, Transformer
    from tokenizer.tokenizer_image.vq_model import VQ_16
    folder, sd, m = c2i
    theirs = Transformer(ModelArgs(dim=DIM, n_layer=LAYERS, n_head=HEADS, n_kv_head=KV, num_classes=CLASSES,
                                   vocab_size=CODES, block_size=16, multiple_of=FFN, cls_token_num=1,
                                   class_dropout_prob=0.1)).eval()
    theirs.load_state_dict(sd)
    codes = torch.randint(CODES, (2, 15), generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([3, CLASSES])
    with torch.no_grad():
        ref, _ = theirs(codes[[0, 0]], labels, input_pos=torch.arange(16))  # teacher-forced [2, 16, V], no cache
        s = m.start(m.encode_prompt("class:3"), 1, True, draft_capacity=16)
        out = m.forward(s, codes[:1], list(range(-1, 14)))
    assert torch.allclose(s.first.cond[0, 0], ref[0, 0], atol=1e-4)
    assert torch.allclose(s.first.uncond[0, 0], ref[1, 0], atol=1e-4)
    assert torch.allclose(out.cond[0], ref[0, 1:], atol=1e-4) and torch.allclose(out.uncond[0], ref[1, 1:], atol=1e-4)
    # their decoder's widths are fixed (ch=128): a full-width VQ-16 with their own random init, saved as they do
    from specar.model_loaders.families.llamagen_vq import load_llamagen_vq
    torch.manual_seed(0)
    vq = VQ_16(codebook_size=CODES, codebook_embed_dim=8).eval()
    path = os.path.join(tmp_path, "vq_ds16_c2i.pt")
    torch.save({"model": vq.state_dict()}, path)
    ours = load_llamagen_vq(path)
    grid = torch.randint(CODES, (1, 4, 4))
    with torch.no_grad():
        pix = vq.decode_code(grid.flatten(), (1, 8, 4, 4))
        assert torch.allclose(ours(grid), pix, atol=1e-4)


def test_a_compiled_sessions_cache_is_reused_unseen(c2i, t2i):
    # the CUDA-graph path keeps one KV cache per model (slot_model._session_cache): reset_cache, with
    # LlamaGenKV.forget_session, must leave nothing of the last session (its pos0, the prompt's length, included)
    assert reused_cache_differences(c2i[2], ["class:3", "class:7"]) == ([], True)
    assert reused_cache_differences(t2i[2], ["a red cat", "a very long prompt about a small red cat in the snow",
                                              "dog"]) == ([], True)


def test_device_auto_loads_on_the_gpu_if_any_else_the_cpu(c2i):
    want = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert specar.load_model(c2i[0], device="auto", n_head=HEADS).device.type == want.type
