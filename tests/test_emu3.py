"""Emu3 adapter on a tiny random-weight `Emu3ForConditionalGeneration` saved in the real on-disk
format (config.json with vocabulary_map, model.safetensors, generation_config.json, tokenizer.json,
tokenizer_config.json, processor_config.json) and loaded by `specar.load_model`.

Checks: the prompt equals Emu3's processor's; row ends (EOL) sit where Emu3's generation
constraint puts them and are never drafted; tree and chain forwards equal sequential forwards
(rows at different committed lengths, row-end tokens inside the chain); `ar` reproduces
transformers' own `generate` (with its unbatched negative-prompt CFG and the row-end constraint)
token for token (greedy) and its VQ decode; every backend runs end to end and decodes an image
of the right size; `sjd` / `scd` sample the exact AR distribution (4 codes, 2x2 grid); bad input
fails clearly.
"""
import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Emu3ForConditionalGeneration"):
    pytest.skip("this transformers has no Emu3", allow_module_level=True)

import specar
from specar.model_loaders.contract import tree_ancestry
from support.conformance import sequential
from support.exactness import chi_square_test, exact_distribution, mark_long
from support.calls import generate_kwargs

TOL = 1e-5
N_SAMPLES = 16000
P_FAIL = 1e-6
PROMPT = "a red cat"
# 2x3 tokens (rows of 3 codes + EOL): image_area 384 px^2 at ratio W:H = 3:2 -> 24x16 pixels
GRID_3X2 = dict(image_area=384, ratio="3:2")
GRID_2X2 = dict(image_area=256, ratio="1:1")


def build_tiny_emu3(folder, codes=4, seed=0, hidden=32):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (Emu3Config, Emu3ForConditionalGeneration, Emu3ImageProcessor, Emu3Processor,
                              GenerationConfig, PreTrainedTokenizerFast)

    words = ["<unk>", "a", "red", "blue", "cat", "dog", "on", "the", "grass", "sky", "no", "blurry", "*"] + \
        [str(d) for d in range(10)]
    specials = ["<|endoftext|>", "<|extra_203|>", "<|extra_204|>", "<|image start|>", "<|image end|>",
                "<|image token|>", "<|extra_200|>", "<|extra_201|>", "<image>"]
    visual = [f"<|visual token{i:06d}|>" for i in range(codes)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens(specials + visual)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<|extra_203|>", eos_token="<|extra_204|>", pad_token="<|endoftext|>",
        unk_token="<unk>", extra_special_tokens={
            "image_token": "<image>", "boi_token": "<|image start|>", "eoi_token": "<|image end|>",
            "image_wrapper_token": "<|image token|>", "eof_token": "<|extra_201|>"})
    proc = Emu3Processor(image_processor=Emu3ImageProcessor(min_pixels=16 * 16, max_pixels=64 * 64), tokenizer=tok)
    cfg = Emu3Config(
        text_config=dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id),
        vq_config=dict(codebook_size=codes, embed_dim=4, latent_channels=4, base_channels=32,
                       channel_multiplier=[1, 1, 1, 1], num_res_blocks=1, attn_resolutions=[],
                       temporal_downsample_factor=4, hidden_size=32, num_attention_heads=1),
        vocabulary_map=tok.get_vocab())
    torch.manual_seed(seed)
    model = Emu3ForConditionalGeneration(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and ("text_model" in name or name.startswith("lm_head")):
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "embed" in name else p.shape[-1] ** -0.5))
        model.lm_head.weight.mul_(3.0)
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id,
                                               eos_token_id=tok.eos_token_id)
    model.save_pretrained(folder)
    proc.save_pretrained(folder)
    return model, proc


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("emu3") / "Emu3-Gen-tiny")
    hf, proc = build_tiny_emu3(folder)
    return folder, hf, proc, specar.load_model(folder, **GRID_3X2)


@pytest.fixture(scope="module")
def mdl(tiny):
    return tiny[3]


@pytest.fixture(scope="module")
def square(tiny):
    return specar.load_model(tiny[0], **GRID_2X2)


def hf_generate(hf, proc, text, negative_ids, grid, H, W, scale=3.0):
    """transformers' own Emu3 generation: Emu3's documented row-end constraint, unbatched CFG."""
    tok = proc.tokenizer
    inputs = proc(text=[text], return_tensors="pt", return_for_image_generation=True, **grid)
    assert inputs.pop("image_sizes")[0] == [H, W]
    visual = hf.vocabulary_mapping.image_tokens

    def allowed(batch_id, input_ids):
        position = torch.nonzero(input_ids == tok.image_wrapper_token_id, as_tuple=True)[0][0]
        offset = input_ids.shape[0] - position
        if offset % (W + 1) == 0:
            return (hf.vocabulary_mapping.eol_token_id,)
        return visual

    out = hf.generate(**inputs, max_new_tokens=H * (W + 1), prefix_allowed_tokens_fn=allowed, do_sample=False,
                      negative_prompt_ids=torch.tensor([negative_ids]), guidance_scale=scale)
    return inputs.input_ids[0].tolist(), out[0, inputs.input_ids.shape[1]:]


def test_loaded_geometry_prompt_and_defaults(tiny):
    folder, hf, proc, mdl = tiny
    g = mdl.geometry
    assert (g.height, g.width, g.vocab_size, g.row_end) == (2, 3, 4, True)
    assert mdl.default_sampling == {"cfg_scale": 3.0, "top_k": 4}  # top-k 2048 capped at the 4 codes
    enc = mdl.encode_prompt(PROMPT, "blurry")
    ref = proc(text=[PROMPT], return_tensors="pt", return_for_image_generation=True, **GRID_3X2)
    assert enc.cond == ref.input_ids[0].tolist()
    assert mdl.format_prompt(PROMPT) == "<|extra_203|>a red cat<|image start|>2*3<|image token|>"
    assert mdl.format_prompt("blurry").endswith("<|image start|>2*3<|image token|>")
    # default grid of Emu3-Gen: 720x720 pixels -> 90x90 tokens (8190 with row ends)
    from specar.model_loaders.families.emu3 import generation_grid
    assert generation_grid("1:1", 518400) == (90, 90)


@pytest.mark.parametrize("text,negative", [(PROMPT, ""), ("blue dog on the grass", "blurry"), ("sky", "no")])
def test_ar_reproduces_transformers_generate_with_row_ends(tiny, text, negative):
    folder, hf, proc, mdl = tiny
    H, W = mdl.geometry.height, mdl.geometry.width
    enc = mdl.encode_prompt(text, negative)
    prompt_ids, ref = hf_generate(hf, proc, text, enc.uncond, GRID_3X2, H, W)
    assert prompt_ids == enc.cond
    res = specar.generate(mdl, text, negative_prompt=negative, backend="ar",
                          sampling=dict(temperature=0, cfg_scale=3.0))
    ids = mdl.to_model_ids(res.sequence)[0]
    assert ids[:H * (W + 1)].tolist() == ref.tolist()
    # the VQ decode of the same layout transformers decodes (EOF, end-of-image, EOS appended)
    full = torch.cat([ref, torch.tensor([mdl.eof_id, mdl.eoi_id, mdl.eos_id])])[None]
    pix = hf.decode_image_tokens(image_tokens=full, height=H, width=W)[0].permute(1, 2, 0)
    expected = ((pix.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()
    got = torch.tensor(list(res.image.tobytes()), dtype=torch.uint8).view(expected.shape).numpy()
    assert (got == expected).all()


@pytest.mark.parametrize("backend", list(specar.BACKENDS))
def test_every_backend_end_to_end_with_row_ends_in_place(mdl, backend, monkeypatch):
    for m in (mdl,):  # hawk / adt_tree: random-weight drafters (no trained files for a random tiny model)
        monkeypatch.setattr(m, "random_drafter_seed", 0, raising=False)
    H, W, V = mdl.geometry.height, mdl.geometry.width, mdl.geometry.vocab_size
    res = specar.generate(mdl, PROMPT, backend=backend, seed=5, batch_size=3, negative_prompt="blurry")
    assert res.tokens.shape == (3, H, W)
    assert len(res.images) == 3 and all(im.size == (8 * W, 8 * H) for im in res.images)
    ids = mdl.to_model_ids(res.sequence)  # [B, H*(W+1)+3]
    offsets = torch.arange(1, ids.shape[1] + 1)  # offset after <|image token|>, as Emu3's constraint counts
    eol = mdl.eol_id
    is_row_end = (offsets % (W + 1) == 0) & (offsets <= H * (W + 1))
    assert (ids[:, is_row_end] == eol).all()
    assert (ids[:, ~is_row_end][:, :-3] != eol).all()
    assert set(ids[:, ~is_row_end][:, :-3].flatten().tolist()) <= set(mdl._img_ids.tolist())
    assert ids[:, -3:].tolist() == [[mdl.eof_id, mdl.eoi_id, mdl.eos_id]] * 3
    assert res.stats.forced_tokens == H  # one EOL per row, filled in by the engine, never sampled


PARENTS = [-1, 0, 0, 1, 1, 2, 5, -1, 7]


@pytest.mark.parametrize("cfg", [False, True])
def test_tree_forward_equals_sequential_with_ragged_rows(mdl, cfg):
    prompt = mdl.encode_prompt(PROMPT, "blurry")  # prompts of different lengths: left padding
    first = torch.tensor([[3, 1, 0, 4], [2, 2, 1, 4]])  # 4 = the row-end token (engine id V)
    done = torch.tensor([4, 2])
    tree = torch.tensor([[1, 2, 3, 0, 4, 2, 3, 0, 1], [3, 2, 1, 4, 3, 2, 1, 0, 3]])
    s = mdl.start(prompt, 2, cfg, draft_capacity=len(PARENTS) + 5)
    mdl.forward(s, first, [-1, 0, 1, 2])
    mdl.commit(s, None, done)
    out = mdl.forward(s, tree, PARENTS)
    anc = tree_ancestry(PARENTS)
    for b in range(2):
        for i in range(len(PARENTS)):
            branch = anc[i].nonzero().flatten()
            prefix = torch.cat([first[b, :done[b]], tree[b, branch]])[None]
            ref = sequential(mdl, prompt, prefix, cfg)
            assert torch.allclose(out.cond[b, i], ref.cond[0, -1], atol=TOL)
            if cfg:
                assert torch.allclose(out.uncond[b, i], ref.uncond[0, -1], atol=TOL)


def test_tree_commit_then_chain_equals_sequential(mdl):
    prompt = mdl.encode_prompt(PROMPT, "no")
    tree = torch.tensor([[1, 2, 3, 0, 4, 2, 3, 0, 1], [3, 2, 1, 4, 3, 2, 1, 0, 3]])
    path, length = torch.tensor([[0, 2, 5, 6], [7, 8, 0, 0]]), torch.tensor([4, 2])
    s = mdl.start(prompt, 2, True, draft_capacity=len(PARENTS) + 5)
    mdl.forward(s, tree, PARENTS)
    mdl.commit(s, path, length)
    nxt = torch.tensor([[4, 3, 1], [2, 4, 0]])
    out = mdl.forward(s, nxt, [-1, 0, 1])
    for b in range(2):
        prefix = torch.cat([tree[b, path[b, :length[b]]], nxt[b]])[None]
        ref = sequential(mdl, prompt, prefix, True)
        assert torch.allclose(out.cond[b, -1], ref.cond[0, -1], atol=TOL)
        assert torch.allclose(out.uncond[b, -1], ref.uncond[0, -1], atol=TOL)


EXACT_CASES = [
    ("sjd", dict(window=3, init="random"), dict(cfg_scale=2.0)),
    ("sjd", dict(window=16, init="sample_above"), dict(cfg_scale=1.0)),
    ("scd", dict(window=3, coupling="maximal"), dict(cfg_scale=2.0, negative_prompt="blurry")),
    ("scd", dict(window=16, coupling="gumbel", coupling_strength=0.5, init="repeat_above"), dict(cfg_scale=2.0)),
]


# `make test-long` runs these (pytest.mark.long): the family's forwards are checked against sequential ones by
# test_adapter_conformance in `make test`, the backends' exactness on tiny models by tests/test_exactness.py
@pytest.mark.parametrize("case", mark_long(EXACT_CASES, ()), ids=lambda c: f"{c[0]}-{'-'.join(f'{k}={v}' for k, v in c[1].items())}")
def test_exactness_chi_square(square, monkeypatch, case):
    backend, params, settings = case
    monkeypatch.setattr(square, "decode_tokens", lambda tokens, prompt=None: None)  # 16000 VQ decodes are not the point
    assert square.geometry.seq_len == 6 and square.geometry.num_image_tokens == 4  # row ends included
    res = specar.generate(square, PROMPT, **generate_kwargs(backend=backend, **settings, **params), seed=4321,
                          batch_size=N_SAMPLES)
    exact = exact_distribution(square, PROMPT, **settings)
    p, stat, dof, tv = chi_square_test(res.tokens, exact)
    assert p > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p:.2e} TV={tv:.4f}"


# -- bad input -----------------------------------------------------------------------------------
def _copy(tiny, tmp_path, name="copy"):
    dst = tmp_path / name
    shutil.copytree(tiny[0], dst)
    return dst


def test_original_format_and_unknown_family(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "Emu3", "auto_map": {"AutoModel": "x.Emu3"}}))
    with pytest.raises(ValueError, match="Emu3-Gen-hf"):
        specar.load_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="no supported model family"):
        specar.load_model(str(tmp_path))


def test_resolution_the_model_was_not_trained_for(tiny):
    with pytest.raises(ValueError, match="image_area=518400.*max_position_embeddings"):
        specar.load_model(tiny[0])  # Emu3-Gen's 90x90 grid does not fit this tiny model's 128 positions
    with pytest.raises(ValueError, match="ratio"):
        specar.load_model(tiny[0], image_area=256, ratio="square")
    with pytest.raises(ValueError, match="image_area"):
        specar.load_model(tiny[0], image_area=-5)


def test_missing_tokenizer_and_mismatched_weights(tiny, tmp_path):
    dst = _copy(tiny, tmp_path)
    os.remove(dst / "tokenizer_config.json")
    with pytest.raises(ValueError, match="tokenizer_config.json"):
        specar.load_model(str(dst), **GRID_2X2)
    dst = _copy(tiny, tmp_path, "mismatch")
    cfg = json.loads((dst / "config.json").read_text())
    cfg["text_config"]["hidden_size"] = 64
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="model.safetensors"):
        specar.load_model(str(dst), **GRID_2X2)
    dst = _copy(tiny, tmp_path, "codebook")
    cfg = json.loads((dst / "config.json").read_text())
    cfg["vq_config"]["codebook_size"] = 8  # the vocabulary has 4 visual tokens
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="config.json|model.safetensors"):
        specar.load_model(str(dst), **GRID_2X2)


@pytest.mark.parametrize("cfg", [False, True])
def test_adapter_conformance(mdl, cfg):
    from support.conformance import check_commit_path, check_hidden_states, check_per_row_trees
    for check in (check_per_row_trees, check_commit_path, check_hidden_states):
        check(mdl, cfg, TOL)


def test_device_auto_loads_on_the_gpu_if_any_else_the_cpu(tiny):
    want = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert specar.load_model(tiny[0], device="auto", **GRID_3X2).device.type == want.type
