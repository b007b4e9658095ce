"""Janus-Pro adapter on a tiny random-weight `JanusForConditionalGeneration` saved in the real
on-disk format (config.json, model.safetensors, generation_config.json, tokenizer.json,
tokenizer_config.json, processor_config.json, chat_template.jinja) and loaded by `specar.load_model`.

Checks: the prompt equals the Janus processor's; tree and chain forwards equal sequential
forwards (rows at different committed lengths); `ar` reproduces transformers' own
`generate(generation_mode="image")` token for token (greedy); every backend runs end to end and
decodes an image of the right size; `sjd` / `scd` sample the exact AR distribution (chi-square
against teacher-forced enumeration; 4 codes on a 2x2 grid = 256 images); bad folders fail clearly.
"""
import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "JanusForConditionalGeneration"):
    pytest.skip("this transformers has no Janus", allow_module_level=True)

import specar
from specar.model_loaders.contract import tree_ancestry
from specar.samplers.drafters.jacobi import drafter as jacobi_mod
from support.conformance import sequential
from support.exactness import chi_square_test, exact_distribution, mark_long
from support.calls import generate_kwargs

TOL = 1e-5
N_SAMPLES = 16000
P_FAIL = 1e-6
PROMPT = "a red cat"
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] | lower == 'user' %}{{ '<|User|>: ' }}"
    "{% for c in message['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{{ '\\n\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|Assistant|>:' }}{% endif %}")


def build_tiny_janus(folder, codes=4, grid=2, seed=0, hidden=32):
    """A random-weight Janus-Pro-shaped model with `codes` VQ codes on a `grid` x `grid` token grid."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    import transformers as tf
    # transformers 5 renamed the PIL image processor (JanusImageProcessor in 4.x)
    JanusImageProcessorPil = getattr(tf, "JanusImageProcessorPil", None) or tf.JanusImageProcessor
    from transformers import (GenerationConfig, JanusConfig, JanusForConditionalGeneration,
                              JanusProcessor, PreTrainedTokenizerFast)

    words = ["<unk>", "a", "red", "blue", "cat", "dog", "on", "the", "grass", "sky", ":", "no", "blurry"]
    specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<|User|>", "<|Assistant|>",
                "<image_placeholder>", "<begin_of_image>", "<end_of_image>"]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens(specials)
    bos = specials[0]
    tk.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tk.token_to_id(bos))])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token=bos, eos_token=specials[1], pad_token=specials[2], unk_token="<unk>",
        extra_special_tokens={"image_token": "<image_placeholder>", "boi_token": "<begin_of_image>",
                              "eoi_token": "<end_of_image>"})
    proc = JanusProcessor(image_processor=JanusImageProcessorPil(size={"height": 16 * grid, "width": 16 * grid}),
                          tokenizer=tok, chat_template=CHAT_TEMPLATE, num_image_tokens=grid * grid)
    cfg = JanusConfig(
        text_config=dict(model_type="llama", vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id),
        vision_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=16 * grid,
                           patch_size=16, projection_dim=hidden, num_image_tokens=grid * grid, mlp_ratio=2.0),
        vq_config=dict(embed_dim=4, num_embeddings=codes, latent_channels=32, base_channels=32,
                       channel_multiplier=[1, 1, 1, 1, 1], num_res_blocks=1, projection_dim=hidden,
                       image_token_embed_dim=hidden, num_hidden_layers=2),
        image_token_id=tok.convert_tokens_to_ids("<image_placeholder>"))
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # unit-scale weights so that next-code distributions are far from uniform
        for name, p in model.named_parameters():
            if p.dim() >= 2 and ("language_model" in name or "generation" in name):
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "embed" in name else p.shape[-1] ** -0.5))
        model.model.generation_head.vision_head.weight.mul_(3.0)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        generation_kwargs={"boi_token_id": tok.convert_tokens_to_ids("<begin_of_image>")})
    model.save_pretrained(folder)
    proc.save_pretrained(folder)
    return model, proc


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("janus") / "Janus-Pro-tiny")
    hf, proc = build_tiny_janus(folder)
    return folder, hf, proc, specar.load_model(folder)


@pytest.fixture(scope="module")
def mdl(tiny):
    return tiny[3]


def hf_prompt_ids(proc, text):
    messages = [{"role": "user", "content": [{"type": "text", "text": text}]}]
    prompt = proc.apply_chat_template(messages, add_generation_prompt=True)
    return proc(text=prompt, generation_mode="image", return_tensors="pt")


def test_loaded_geometry_and_defaults(mdl):
    assert type(mdl).__name__ == "JanusImageModel"
    g = mdl.geometry
    assert (g.height, g.width, g.vocab_size, g.row_end) == (2, 2, 4, False)
    assert mdl.default_sampling == {"cfg_scale": 5.0, "top_k": 4}  # top-k 1000 capped at the 4 codes


def test_prompt_is_the_processors(tiny):
    folder, hf, proc, mdl = tiny
    enc = mdl.encode_prompt(PROMPT)
    assert enc.cond == hf_prompt_ids(proc, PROMPT).input_ids[0].tolist()
    assert mdl.format_prompt(PROMPT) == "<|User|>: a red cat\n\n<|Assistant|>:<begin_of_image>"  # Janus-Pro's format
    pad, keep = mdl.pad_id, (mdl.bos_id, mdl.boi_id)
    assert enc.uncond == [t if t in keep else pad for t in enc.cond]  # transformers' unconditional row
    assert enc.uncond[0] == mdl.bos_id and enc.uncond[-1] == mdl.boi_id
    assert mdl.encode_prompt(PROMPT, "blurry").uncond == hf_prompt_ids(proc, "blurry").input_ids[0].tolist()


PARENTS = [-1, 0, 0, 1, 1, 2, 5, -1, 7]  # two roots, branching, depth up to 4


@pytest.mark.parametrize("cfg", [False, True])
def test_tree_forward_equals_sequential_with_ragged_rows(mdl, cfg):
    prompt = mdl.encode_prompt(PROMPT, "" if cfg else "")
    first = torch.tensor([[3, 1, 0], [2, 2, 1]])
    done = torch.tensor([3, 1])  # row 0 committed 3 tokens, row 1 only 1: different lengths in one batch
    tree = torch.tensor([[1, 2, 3, 0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 3, 2, 1, 0, 3]])
    s = mdl.start(prompt, 2, cfg, draft_capacity=len(PARENTS) + 4)
    mdl.forward(s, first, [-1, 0, 1])
    mdl.commit(s, None, done)
    assert s.committed.tolist() == [3, 1]
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


def test_chain_and_tree_commit_equal_sequential(mdl):
    prompt = mdl.encode_prompt(PROMPT)
    tree = torch.tensor([[1, 2, 3, 0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 3, 2, 1, 0, 3]])
    path, length = torch.tensor([[0, 2, 5, 6], [7, 8, 0, 0]]), torch.tensor([4, 2])
    s = mdl.start(prompt, 2, True, draft_capacity=len(PARENTS) + 4)
    mdl.forward(s, tree, PARENTS)
    mdl.commit(s, path, length)
    nxt = torch.tensor([[3, 3, 1], [2, 2, 0]])
    out = mdl.forward(s, nxt, [-1, 0, 1])  # a chain after a gathered tree path
    for b in range(2):
        prefix = torch.cat([tree[b, path[b, :length[b]]], nxt[b]])[None]
        ref = sequential(mdl, prompt, prefix, True)
        assert torch.allclose(out.cond[b, -1], ref.cond[0, -1], atol=TOL)
        assert torch.allclose(out.uncond[b, -1], ref.uncond[0, -1], atol=TOL)


@pytest.mark.parametrize("text", [PROMPT, "blue dog on the grass", "sky"])
def test_ar_reproduces_transformers_generate(tiny, text):
    folder, hf, proc, mdl = tiny
    inputs = hf_prompt_ids(proc, text)
    ref = hf.generate(**inputs, generation_mode="image", do_sample=False, guidance_scale=5)
    res = specar.generate(mdl, text, backend="ar", sampling=dict(temperature=0, cfg_scale=5))
    assert res.tokens.flatten().tolist() == ref[0].tolist()
    pixels = hf.decode_image_tokens(ref)
    expected = ((pixels[0].float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()
    assert (torch.tensor(list(res.image.tobytes())).view(expected.shape).numpy() == expected).all()


@pytest.mark.parametrize("backend", list(specar.BACKENDS))
def test_every_backend_end_to_end(mdl, backend, monkeypatch):
    for m in (mdl,):  # hawk / adt_tree: random-weight drafters (no trained files for a random tiny model)
        monkeypatch.setattr(m, "random_drafter_seed", 0, raising=False)
    res = specar.generate(mdl, PROMPT, backend=backend, seed=4, batch_size=2)
    assert res.tokens.shape == (2, 2, 2)
    assert len(res.images) == 2 and all(im.size == (32, 32) for im in res.images)  # 2x2 tokens x 16 px
    assert res.stats.image_tokens == 4 and res.stats.nfe >= 1


def _exact_case(mdl, backend, params, settings, seed=1234, n=N_SAMPLES):
    res = specar.generate(mdl, PROMPT, **generate_kwargs(backend=backend, reproducible=False, **settings, **params),
                          seed=seed,
                          batch_size=n)  # rejection sampling (the reproducible mode: tests/test_reproducible.py)
    exact = exact_distribution(mdl, PROMPT, **settings)
    return chi_square_test(res.tokens, exact), res


EXACT_CASES = [
    ("sjd", dict(window=3, init="random"), dict(cfg_scale=2.0)),
    ("sjd", dict(window=16, init="sample_above"), dict(cfg_scale=1.0, temperature=1.0)),
    ("scd", dict(window=3, coupling="maximal"), dict(cfg_scale=2.0, negative_prompt="blurry")),
    ("scd", dict(window=16, coupling="gumbel", coupling_strength=0.5, init="sample_left"), dict(cfg_scale=2.0)),
    ("sjd_pac", dict(window=3, tree_depth=2, tree_width=3), dict(cfg_scale=2.0)),
]


@pytest.fixture
def no_decode(mdl, monkeypatch):
    monkeypatch.setattr(mdl, "decode_tokens", lambda tokens, prompt=None: None)  # 16000 VQ decodes are not the point here
    return mdl


# `make test` runs the first case (sjd), `make test-long` the others (pytest.mark.long)
@pytest.mark.parametrize("case", mark_long(EXACT_CASES, (0,)), ids=lambda c: f"{c[0]}-{'-'.join(f'{k}={v}' for k, v in c[1].items())}")
def test_exactness_chi_square(no_decode, case):
    backend, params, settings = case
    (p, stat, dof, tv), res = _exact_case(no_decode, backend, params, settings)
    assert p > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p:.2e} TV={tv:.4f}"


def test_planted_stale_q_is_caught(no_decode, monkeypatch):
    orig = jacobi_mod.JacobiDrafter._redraft

    def stale(self, state, p, tpos, mrs_out, noise):
        y, _ = orig(self, state, p, tpos, mrs_out, noise)
        return y, state.draft.dist[state.rows[:, None], tpos % self.ring]

    monkeypatch.setattr(jacobi_mod.JacobiDrafter, "_redraft", stale)
    (p, stat, dof, tv), _ = _exact_case(no_decode, "sjd", dict(window=3), dict(cfg_scale=1.0))
    assert p < P_FAIL, f"planted bug went unnoticed: p={p:.2e} TV={tv:.4f}"


# -- bad input -----------------------------------------------------------------------------------
def _copy(tiny, tmp_path, name="copy"):
    dst = tmp_path / name
    shutil.copytree(tiny[0], dst)
    return dst


def test_unsupported_family_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ValueError, match="no supported model family.*bert"):
        specar.load_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "multi_modality"}))
    with pytest.raises(ValueError, match="deepseek-community/Janus-Pro"):
        specar.load_model(str(tmp_path))


def test_config_weights_mismatch(tiny, tmp_path):
    dst = _copy(tiny, tmp_path)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["text_config"]["num_hidden_layers"] = 3  # the checkpoint has 2
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="model.safetensors"):
        specar.load_model(str(dst))
    cfg["text_config"]["num_hidden_layers"] = 2
    cfg["text_config"]["intermediate_size"] = 48  # wrong shapes
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="model.safetensors"):
        specar.load_model(str(dst))


def test_missing_files(tiny, tmp_path):
    dst = _copy(tiny, tmp_path)
    os.remove(dst / "tokenizer.json")
    with pytest.raises(ValueError, match="tokenizer.json"):
        specar.load_model(str(dst))
    dst = _copy(tiny, tmp_path, "noweights")
    os.remove(dst / "model.safetensors")
    with pytest.raises(ValueError, match="model.safetensors"):
        specar.load_model(str(dst))


def test_wrong_resolution_and_dtype(tiny):
    with pytest.raises(ValueError, match="image_size=384"):
        specar.load_model(tiny[0], image_size=384)
    with pytest.raises(ValueError, match="dtype"):
        specar.load_model(tiny[0], dtype="int8")


@pytest.mark.parametrize("cfg", [False, True])
def test_adapter_conformance(mdl, cfg):
    from support.conformance import check_commit_path, check_hidden_states, check_per_row_trees
    for check in (check_per_row_trees, check_commit_path, check_hidden_states):
        check(mdl, cfg, TOL)


def test_device_auto_loads_on_the_gpu_if_any_else_the_cpu(tiny):
    want = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert specar.load_model(tiny[0], device="auto").device.type == want.type
