"""Emu3.5 / Emu3.5-Image adapter on a tiny random-weight folder in the released layout, written by
support/tiny_emu35.py: config.json with the reference's Emu3Config keys (model_type "Emu3", explicit head_dim),
two safetensors shards + index under the reference's tensor names, ``emu3.tiktoken`` and
``emu3_vision_tokens.txt``, and a VisionTokenizer folder (IBQ's ``config.yaml`` + ``model.ckpt``).

Reference generation: a plain loop in this file written from the architecture (full recomputation without cache,
each branch at positions from 0, per-head RMS q / k norm, grouped key/value heads, rotate-half rotary, the
reference's guidance ``s * (log_softmax(c) - log_softmax(u)) + log_softmax(u)`` over the whole vocabulary, then the
visual ids only, the row end forced after every W codes).
"""
import gc
import json
import os
import re
import shutil
import unicodedata

import pytest
import torch
import torch.nn.functional as F

import specar
from specar.model_loaders.families.emu35 import SIZES, TEMPLATE, UNCOND
from specar.model_loaders.registry import FAMILIES, detect_family
from specar.model_loaders.resolutions import load_options
from specar.samplers.verification import rejection as rejection_mod
from support import tiny_emu35
from support.conformance import check_conformance
from support.exactness import chi_square_test, exact_distribution
from support.calls import generate_kwargs
CODES, HEADS, KV, HEAD_DIM, LAYERS = (tiny_emu35.CODES, tiny_emu35.HEADS, tiny_emu35.KV, tiny_emu35.HEAD_DIM,
                                      tiny_emu35.LAYERS)
PROMPT = "a red cat"
P_FAIL = 1e-6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("emu35") / "Emu3.5-Image")
    sd = tiny_emu35.build(folder)
    return folder, sd, specar.load_model(folder, resolution="32x32")  # 2 x 2 codes


def _copy(tiny, tmp_path, name="Emu3.5-Image"):
    dst = tmp_path / name
    shutil.copytree(tiny[0], dst)
    return dst


def text_of(m, ids):
    """Ids back to text through the rank table and the special tokens (the tokenizer's inverse)."""
    inv = {r: t for t, r in m.tokenizer.ranks.items()}
    inv.update({i: t.encode() for t, i in m.tokenizer.special.items()})
    return b"".join(inv[i] for i in ids).decode()


# -- reference computation ------------------------------------------------------------------------------------------
def rms(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def ref_logits(sd, ids, theta=1000000.0):
    """Full-vocabulary logits of every position of `ids`, recomputed from scratch."""
    T = len(ids)
    x = sd["model.embed_tokens.weight"][ids]
    inv = 1.0 / theta ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)
    ang = torch.outer(torch.arange(T).float(), inv)
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]

    def rope(t):
        t1, t2 = t[..., :HEAD_DIM // 2], t[..., HEAD_DIM // 2:]
        return t * cos + torch.cat([-t2, t1], -1) * sin

    causal = torch.full((T, T), float("-inf")).triu(1)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        h = rms(x, sd[p + "input_layernorm.weight"])
        q = (h @ sd[p + "self_attn.q_proj.weight"].T).view(T, HEADS, HEAD_DIM)
        k = (h @ sd[p + "self_attn.k_proj.weight"].T).view(T, KV, HEAD_DIM)
        q, k = rope(rms(q, sd[p + "self_attn.q_norm.weight"])), rope(rms(k, sd[p + "self_attn.k_norm.weight"]))
        v = (h @ sd[p + "self_attn.v_proj.weight"].T).view(T, KV, HEAD_DIM)
        k, v = k.repeat_interleave(HEADS // KV, 1), v.repeat_interleave(HEADS // KV, 1)
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / HEAD_DIM ** 0.5 + causal, -1)
        x = x + torch.einsum("hqk,khd->qhd", att, v).reshape(T, -1) @ sd[p + "self_attn.o_proj.weight"].T
        h = rms(x, sd[p + "post_attention_layernorm.weight"])
        x = x + (F.silu(h @ sd[p + "mlp.gate_proj.weight"].T) * (h @ sd[p + "mlp.up_proj.weight"].T)) @ \
            sd[p + "mlp.down_proj.weight"].T
    return rms(x, sd["model.norm.weight"]) @ sd["lm_head.weight"].T


def ref_greedy(sd, cond, uncond, H, W, first_code, eol, eoi, scale):
    cond, uncond, out = list(cond), list(uncond), []
    for j in range(H * (W + 1)):
        if (j + 1) % (W + 1) == 0:  # the reference's logits processor forces EOL, and EOI after the last row
            tok = eoi if j == H * (W + 1) - 1 else eol
        else:
            lc, lu = F.log_softmax(ref_logits(sd, cond)[-1], -1), F.log_softmax(ref_logits(sd, uncond)[-1], -1)
            g = scale * (lc - lu) + lu
            tok = first_code + int(g[first_code:first_code + CODES].argmax())
        out.append(tok)
        cond.append(tok)
        uncond.append(tok)
    return out


# -- tests ------------------------------------------------------------------------------------------------------------
def test_detected_loaded_prompt_layout_and_defaults(tiny):
    folder, sd, m = tiny
    assert detect_family(folder) == "emu35" and m.family == "emu35"
    g = m.geometry
    assert (g.height, g.width, g.vocab_size, g.row_end) == (2, 2, CODES, True)
    assert m.default_sampling == {"cfg_scale": 5.0, "top_k": CODES}  # Emu3.5-Image: cfg 5, top-k 5120 capped at 4
    enc = m.encode_prompt(PROMPT)
    assert text_of(m, enc.cond) == TEMPLATE.format(PROMPT) + "<|image start|>2*2<|image token|>"
    assert text_of(m, enc.uncond) == UNCOND + "<|image start|>2*2<|image token|>"
    assert text_of(m, m.encode_prompt(PROMPT, "blue dog").uncond).startswith(TEMPLATE.format("blue dog"))
    assert enc.cond[0] == m.tokenizer.special["<|extra_203|>"] and len(enc.cond) < len(TEMPLATE.format(PROMPT))
    # the image head holds the visual rows of lm_head only; the IBQ decoder the checkpoint's weights
    first = m.tokenizer.special["<|visual token 000000|>"]
    assert torch.equal(m.net.lm_head.weight, sd["lm_head.weight"][first:first + CODES])
    ibq = torch.load(os.path.join(folder, "vision_tokenizer", "model.ckpt"), weights_only=True)["state_dict"]
    assert torch.equal(m.vq.decoder.conv_out.weight, ibq["decoder.conv_out.weight"]) and m.vq.downsample == 16
    assert FAMILIES["emu35"].sampling[1].describe() == "Emu3.5: cfg 2, top-k 5120"


def test_adapter_conformance(tiny):
    check_conformance(specar.load_model(tiny[0], resolution="64x48"))  # row ends inside chains and trees


def test_a_folder_named_emu35_gets_its_guidance(tiny, tmp_path):
    """Emu3.5 (not -Image): guidance 2, the VisionTokenizer found beside the folder under its released name."""
    d = _copy(tiny, tmp_path, "Emu3.5")
    shutil.move(str(d / "vision_tokenizer"), str(tmp_path / "Emu3.5-VisionTokenizer"))
    assert specar.load_model(str(d), resolution="32x32").default_sampling == {"cfg_scale": 2.0, "top_k": CODES}


def test_tokenizer_matches_tiktoken_when_installed(tiny):
    tiktoken = pytest.importorskip("tiktoken")
    from specar.model_loaders.families.emu35 import PRETOKENIZE
    m = tiny[2]
    enc = tiktoken.Encoding("emu3", pat_str=PRETOKENIZE, mergeable_ranks=m.tokenizer.ranks,
                            special_tokens=m.tokenizer.special)
    for text in (TEMPLATE.format(PROMPT), UNCOND, "64*64", "A cat's 12 hats,\n  don't  ü!", "cafe\u0301"):
        assert m.tokenizer.encode(text) == enc.encode(unicodedata.normalize("NFC", text), allowed_special="all")


def test_tokenizer_against_the_released_files():
    """Opt-in: EMU35_TOKENIZER=<a folder with the release's emu3.tiktoken and emu3_vision_tokens.txt> (BAAI/Emu3.5, or
    github.com/baaivision/Emu3.5's src/tokenizer_emu3_ibq): the ids of the reference's logits processor constants,
    its 282926-token vocabulary, and tiktoken's encoding of prompts in several scripts."""
    folder = os.environ.get("EMU35_TOKENIZER")
    if not folder:
        pytest.skip("set EMU35_TOKENIZER to a folder with the released tokenizer files")
    tiktoken = pytest.importorskip("tiktoken")
    from specar.model_loaders.families.emu35 import PRETOKENIZE, Emu35Tokenizer
    t = Emu35Tokenizer(folder)
    s = t.special
    assert [s[n] for n in ("<|extra_200|>", "<|extra_203|>", "<|image token|>", "<|image start|>", "<|image end|>",
                           "<|visual token 000000|>")] == [151846, 151849, 151851, 151852, 151853, 151854]
    assert max(s.values()) + 1 == 282926 and t.encode("64*64") == [21, 19, 9, 21, 19]
    enc = tiktoken.Encoding("emu3", pat_str=PRETOKENIZE, mergeable_ranks=t.ranks, special_tokens=s)
    for text in (TEMPLATE.format('Two dogs by a hole, a sign says "KEEP OUT" (2025)'), UNCOND,
                 "Ünïcödé café 北京 日本語 😀 tabs\tand\n\nnewlines  spaces", "cafe\u0301"):
        assert t.encode(text) == enc.encode(unicodedata.normalize("NFC", text), allowed_special="all")


@pytest.mark.parametrize("text,negative,resolution", [(PROMPT, "", "32x32"), ("blue dog on the grass", "blurry",
                                                                                 "64x48")])
def test_ar_equals_a_plain_loop_written_from_the_architecture(tiny, text, negative, resolution):
    folder, sd, _ = tiny
    m = specar.load_model(folder, resolution=resolution)
    H, W = m.geometry.height, m.geometry.width
    enc = m.encode_prompt(text, negative)
    s = m.tokenizer.special
    ref = ref_greedy(sd, enc.cond, enc.uncond, H, W, s["<|visual token 000000|>"], s["<|extra_200|>"],
                     s["<|image end|>"], 5.0)
    res = specar.generate(m, text, negative_prompt=negative, backend="ar", sampling=dict(temperature=0, cfg_scale=5.0))
    assert m.to_model_ids(res.sequence)[0].tolist() == ref
    assert res.image.size == (W * 16, H * 16)


@pytest.mark.parametrize("backend", [b for b in specar.BACKENDS if b != "ar"])
def test_every_lossless_backend_gives_ars_image_in_the_same_image_mode(tiny, backend, monkeypatch):
    folder, _, _ = tiny
    m = specar.load_model(folder, resolution="64x48")  # 3 rows of 4 codes
    monkeypatch.setattr(m, "random_drafter_seed", 0, raising=False)  # hawk / adt_tree / spatial: random drafters
    want = specar.generate(m, PROMPT, backend="ar", seed=3, batch_size=3, options=dict(reproducible=True))
    got = specar.generate(m, PROMPT, backend=backend, seed=3, batch_size=3, options=dict(reproducible=True))
    assert torch.equal(got.sequence, want.sequence) and len(got.images) == 3
    assert got.images[0].size == (64, 48) and got.stats.forced_tokens == 3


def _chi_square(m, backend, n=4000, **params):
    """One batched generation of `n` images (each backend's own verification: reproducible=False) against exact
    enumeration of the 4^4 images, guidance on (the model default, cfg 5)."""
    exact = exact_distribution(m, PROMPT)
    res = specar.generate(m, PROMPT, **generate_kwargs(backend=backend, reproducible=False, **params), seed=11,
                          batch_size=n)
    return chi_square_test(res.tokens, exact)


@pytest.mark.long  # about 30 s each on a loaded CPU
@pytest.mark.parametrize("backend,params", [("ar", {}), ("sjd", dict(window=3, init="random")),
                                            ("sjd_pac", dict(window=3, tree_depth=2, tree_width=3))])
def test_first_image_tokens_match_exact_enumeration_with_guidance(tiny, backend, params):
    p_value, stat, dof, tv = _chi_square(tiny[2], backend, **params)
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"


@pytest.mark.long
def test_the_chi_square_catches_a_planted_residual_bug(tiny, monkeypatch):
    # planted bug: after a rejection resample from p instead of norm(max(0, p - q))
    monkeypatch.setattr(rejection_mod, "residual", lambda p, q: p)
    p_value, stat, dof, tv = _chi_square(tiny[2], "sjd", window=3, init="random")
    assert p_value < P_FAIL, f"planted residual bug went unnoticed: p={p_value:.2e} TV={tv:.4f}"


def test_sizes_offered_and_refused(tiny):
    folder = tiny[0]
    assert "1024x1024" in SIZES and "1168x880" in SIZES and SIZES[0] == "1024x1024"
    assert set(SIZES) <= set(FAMILIES["emu35"].resolutions)
    assert load_options(folder, "1168x880") == {"resolution": "1168x880"}
    with pytest.raises(ValueError, match=r"multiples of 16 px; got resolution '1000x1000' .*1024x1024, 1168x880"):
        load_options(folder, "1000x1000")
    m = specar.load_model(folder)  # model default: 1024x1024, 64 x 64 codes
    assert (m.geometry.height, m.geometry.width) == (64, 64)
    assert text_of(m, m.encode_prompt("x").cond).endswith("<|image start|>64*64<|image token|>")
    assert load_options(folder, offload="auto") == {"device_map": "auto"}


def test_int4_weights_generate_and_stay_exact_to_their_own_ar(tiny):
    m = specar.load_model(tiny[0], resolution="32x32", quantize="int4")
    assert m.quantization == "int4"
    want = specar.generate(m, PROMPT, backend="ar", seed=2, batch_size=2, options=dict(reproducible=True))
    got = specar.generate(m, PROMPT, backend="sjd", seed=2, batch_size=2, options=dict(reproducible=True))
    assert torch.equal(got.sequence, want.sequence)


def test_offload_auto_under_a_memory_cap_moves_layers_to_disk_and_keeps_ars_tokens(tiny, tmp_path):
    """offload auto on the CPU (the model's device) with a CPU memory cap that holds all but the layers and room to
    bring one layer in: accelerate places the rest on disk, read back at each forward; the tokens stay those of the
    model held whole, with every backend (same seed)."""
    sizes = {n: p.numel() * p.element_size() for n, p in tiny[2].net.named_parameters()}
    cap = sum(v for n, v in sizes.items() if not n.startswith("model.layers.") or n.startswith("model.layers.0."))
    m = specar.load_model(tiny[0], device="cpu", resolution="32x32", device_map="auto", max_memory={"cpu": cap + 1024},
                          offload_folder=str(tmp_path))
    placed = m.net.hf_device_map
    assert placed["model.embed_tokens"] == "cpu" and "disk" in placed.values(), placed
    assert m.net.model.layers[-1].mlp.down_proj.weight.device.type == "meta"  # not held in memory
    (offloaded,) = tmp_path.iterdir()  # a new folder of its own in offload_folder, with the weights placed on disk
    assert (offloaded / "index.json").is_file()
    enc = m.encode_prompt(PROMPT)
    assert torch.allclose(m.start(enc, 1, True, 4).first.cond, tiny[2].start(enc, 1, True, 4).first.cond, atol=1e-5)
    want = specar.generate(tiny[2], PROMPT, backend="ar", seed=3, batch_size=3,
                           options=dict(reproducible=True)).sequence
    m.random_drafter_seed = 0  # hawk / adt_tree / spatial: random drafters
    for backend in specar.BACKENDS:
        got = specar.generate(m, PROMPT, backend=backend, seed=3, batch_size=3,
                              options=dict(reproducible=True)).sequence
        assert torch.equal(got, want), backend
    del m
    gc.collect()
    assert not offloaded.exists()  # removed with the model


@pytest.mark.parametrize("options, message", [
    (dict(quantize="int4"), "quantize='int4' and device_map='auto' (offload) do not combine"),
    (dict(max_memory={"cpu": 1000}), "offload: max_memory['cpu'] is 1000 bytes; the model needs at least"),
    (dict(max_memory={0: 10 ** 9, "cpu": 10 ** 9}), "max_memory names [0]: offload runs every layer on cpu"),
    (dict(device_map="balanced"), "device_map must be 'auto' (accelerate places whole decoder layers), got 'balanced'")])
def test_offload_cases_that_cannot_work_are_refused_naming_why(tiny, options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        specar.load_model(tiny[0], device="cpu", resolution="32x32", **{"device_map": "auto", **options})


def test_missing_and_corrupt_files_are_refused_naming_them(tiny, tmp_path):
    def refused(folder, match, **kw):
        with pytest.raises(ValueError, match=match):
            specar.load_model(str(folder), resolution="32x32", **kw)

    d = _copy(tiny, tmp_path, "no-tiktoken")
    os.remove(d / "emu3.tiktoken")
    refused(d, "emu3.tiktoken is missing")
    d = _copy(tiny, tmp_path, "cut-shard")
    shard = d / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    refused(d, "model-00002-of-00002.safetensors is not a valid safetensors file")
    d = _copy(tiny, tmp_path, "no-vq")
    shutil.rmtree(d / "vision_tokenizer")
    refused(d, r"VisionTokenizer folder .* was not found at .*vision_tokenizer.*Emu3.5-VisionTokenizer")
    d = _copy(tiny, tmp_path, "no-ckpt")
    os.remove(d / "vision_tokenizer" / "model.ckpt")
    refused(d, "VisionTokenizer weights file model.safetensors or model.ckpt is missing")
    d = _copy(tiny, tmp_path, "pickled-ckpt")
    torch.save({"state_dict": {}, "callback": Exception("x")}, d / "vision_tokenizer" / "model.ckpt")
    refused(d, r"model.ckpt cannot be loaded safely: torch.load\(weights_only=True\) refused it")
    d = _copy(tiny, tmp_path, "bad-yaml")
    (d / "vision_tokenizer" / "config.yaml").write_text("embed_dim: [")
    refused(d, "config.yaml is not a VQGAN config")
    d = _copy(tiny, tmp_path, "few-codes")
    lines = (d / "emu3_vision_tokens.txt").read_text().splitlines()
    (d / "emu3_vision_tokens.txt").write_text("\n".join(lines[:-1]))
    refused(d, r"emu3_vision_tokens.txt must list .* <\|visual token 000003\|> \(the 4 codes of")
    d = _copy(tiny, tmp_path, "bad-ids")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "eol_token_id": 7}))
    refused(d, r"config.json: eol_token_id 7.* but the tokenizer files give <\|extra_200\|> id")


@pytest.mark.parametrize("flavour", ["v3", "v1"])
def test_the_example_workflow_runs_on_the_tiny_folder(tiny, comfy, monkeypatch, flavour):
    """example_workflows/api/SpecAR - Emu3.5-Image.json (its flat twin for the V1 nodes) through the node classes, the
    tiny folder as models/specar/Emu3.5-Image (its VisionTokenizer inside): the loader's values valid as shipped
    (1024x1024), then run at 256x256 (16 x 16 codes) for the tests' time, at the checkpoint's sampling."""
    from specar.model_loaders import registry
    from specar.nodes import models
    from support.node_harness import EXAMPLES, comfy_validation_errors, load_json, node_classes, read_ui_values
    from support.node_harness import run_api_workflow
    shutil.copytree(tiny[0], os.path.join(comfy["models_dir"], "specar", "Emu3.5-Image"))
    monkeypatch.setattr(models, "load_model", registry.load_model)
    prompt = load_json(os.path.join(EXAMPLES, "api", *([] if flavour == "v3" else ["flat"]),
                                    "SpecAR - Emu3.5-Image.json"))
    loader = next(n for n in load_json(os.path.join(EXAMPLES, "SpecAR - Emu3.5-Image.json"))["nodes"]
                  if n["type"] == "SpecARModelLoader")
    cls = node_classes("v3")["SpecARModelLoader"]
    read = read_ui_values(cls, loader["widgets_values"], "Emu3.5 loader")
    assert read == prompt[str(loader["id"])]["inputs"] and comfy_validation_errors(cls, read) == []
    assert read["model"] == "Emu3.5-Image" and read["resolution"] == "1024x1024"
    prompt[str(loader["id"])]["inputs"]["resolution"] = "256x256"
    outputs, _ = run_api_workflow(prompt, node_classes(flavour))
    (sampler,) = [nid for nid in prompt if prompt[nid]["class_type"] == "SpecARSampler"]
    image, tokens, stats, _ = outputs[sampler]
    s = json.loads(stats)
    assert tokens["tokens"].shape == (1, 16, 16) and image.shape == (1, 256, 256, 3)
    assert s["backend"] == "auto" and (s["sampling"]["cfg_scale"], s["sampling"]["top_k"]) == (5.0, CODES)


def test_decoder_against_the_authors_layers(tiny):
    """Opt-in: EMU35_REPO=<a checkout of github.com/baaivision/Emu3.5>: its own decoder layers (src/emu3p5's
    Emu3DecoderLayer, eager attention, with its q / k norms) on the tiny folder's weights give our logits for a prompt
    and 20 image positions (row ends included)."""
    repo = os.environ.get("EMU35_REPO")
    if not repo:
        pytest.skip("set EMU35_REPO to a checkout of github.com/baaivision/Emu3.5")
    import sys

    import transformers.utils.import_utils as import_utils
    if not hasattr(import_utils, "is_torch_fx_available"):  # the authors' code imports it (transformers 4.x)
        import_utils.is_torch_fx_available = lambda: False
    sys.path.insert(0, repo)
    try:
        from src.emu3p5 import modeling_emu3 as theirs
    finally:
        sys.path.remove(repo)
    folder, sd, _ = tiny
    m = specar.load_model(folder, resolution="64x48")
    with open(os.path.join(folder, "config.json")) as f:
        raw = json.load(f)
    cfg = theirs.Emu3Config(**{k: v for k, v in raw.items() if k not in ("architectures", "auto_map", "model_type")})
    cfg._attn_implementation, cfg.rope_scaling = "eager", None  # transformers 5 fills a rope_scaling dict of its own
    layers = []
    for i in range(LAYERS):
        layer, p = theirs.Emu3DecoderLayer(cfg, i).eval(), f"model.layers.{i}."
        layer.load_state_dict({k[len(p):]: v for k, v in sd.items() if k.startswith(p)}, strict=True)
        layers.append(layer)
    norm = theirs.Emu3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
    norm.weight.data = sd["model.norm.weight"]
    enc = m.encode_prompt(PROMPT)
    tokens = torch.randint(CODES + 1, (1, 20), generator=torch.Generator().manual_seed(0))  # codes and row ends
    ids = torch.tensor([enc.cond + m._engine_to_model[tokens][0].tolist()])
    T, P = ids.shape[1], len(enc.cond)
    x = sd["model.embed_tokens.weight"][ids]
    mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)[None, None]
    with torch.no_grad():
        for layer in layers:
            x = layer(x, attention_mask=mask, position_ids=torch.arange(T)[None])[0]
        first = m.tokenizer.special["<|visual token 000000|>"]
        ref = (norm(x)[0] @ sd["lm_head.weight"].T)[:, first:first + CODES]
    s = m.start(enc, 1, False, draft_capacity=20)
    out = m.forward(s, tokens, list(range(-1, 19)))
    assert torch.allclose(s.first.cond[0, 0], ref[P - 1], atol=1e-5)
    assert torch.allclose(out.cond[0], ref[P:], atol=1e-5)


def test_device_auto_loads_on_the_gpu_if_any_else_the_cpu(tiny):
    want = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert specar.load_model(tiny[0], device="auto", resolution="32x32").device.type == want.type
