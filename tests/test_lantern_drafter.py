"""LANTERN's released EAGLE drafters (github.com/jadohu/LANTERN: Anole and LlamaGen) converted to our
drafter files (`python -m specar convert-drafter --kind lantern`), on tiny random-weight drafters
saved in LANTERN's layout: its config.json keys, its state-dict names (``embed_tokens.weight``,
``fc.weight`` / ``fc.bias``, ``layers.0.self_attn.{q,k,v,o}_proj``, Anole's ``q_norm`` / ``k_norm``
with weight and bias [heads, head_dim], ``layers.0.mlp.*``, the RMSNorms) in ``pytorch_model.bin``
(a plain pickled state dict) or ``model.safetensors``.

The reference (`lantern_logits`) is written here from LANTERN's layer definitions
(models/drafters/cnets_anole.py, cnets_llamagen.py at 3a56e45), on the raw state dict: fc over
[embedding; hidden]; Anole: input RMSNorm, per-head LayerNorm on q / k, 1D rotate-half rotary at
absolute positions; LlamaGen: no input norm, 2D rotary on interleaved pairs as complex numbers,
image code j at grid cell j; full causal attention; the target's LM head on image codes.
"""
import json
import os
import shutil
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F

import specar
from specar.model_loaders.families.chameleon import code_token_name
from specar.samplers.drafters.eagle import load_eagle
from specar.samplers.drafters.eagle.lantern_conversion import convert_lantern_drafter
from support import SPECAR_PARENT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the tiny-model builders (--import-mode=importlib)
from test_chameleon import build_tiny_chameleon  # noqa: E402
from test_llamagen import CODES, DIM, HEADS, build_t5, gpt_state, vq_state  # noqa: E402



# -- tiny drafters in LANTERN's layout ---------------------------------------------------------------

def anole_config(hidden, heads, vocab, ffn=64):
    # data/configs/anole_config.json's keys, tiny sizes
    return {"architectures": ["ChameleonForConditionalGeneration"], "attention_bias": False,
            "attention_dropout": 0.0, "hidden_act": "silu", "hidden_size": hidden, "intermediate_size": ffn,
            "max_position_embeddings": 4096, "mlp_bias": False, "model_parallel_size": 1,
            "model_type": "chameleon", "num_attention_heads": heads, "num_hidden_layers": 1,
            "num_key_value_heads": heads, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
            "swin_norm": False, "tie_word_embeddings": False, "torch_dtype": "float32", "vocab_size": vocab}


def llamagen_config(hidden, heads, vocab, ffn=64, input_type="t2i"):
    # data/configs/llamagen_t2i_config.json's keys, tiny sizes
    return {"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
            "hidden_size": hidden, "caption_dim": 2048, "class_dropout_p": 0.0, "initializer_range": 0.02,
            "intermediate_size": ffn, "max_position_embeddings": 2048, "model_type": "llama",
            "num_attention_heads": heads, "num_hidden_layers": 1, "num_key_value_heads": heads,
            "pretraining_tp": 1, "rms_norm_eps": 1e-06, "rope_scaling": None, "tie_word_embeddings": False,
            "torch_dtype": "float16", "use_cache": True, "vocab_size": vocab, "input_type": input_type}


def lantern_state(cfg, embed, seed):
    """A random state dict with exactly the keys of LANTERN's Model(config) (strict load)."""
    g = torch.Generator().manual_seed(seed)
    D, h, Fn = cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"]
    r = lambda *s: torch.randn(*s, generator=g) * s[-1] ** -0.5  # noqa: E731
    L = "layers.0."
    sd = {"embed_tokens.weight": embed.clone(), "fc.weight": r(D, 2 * D), "fc.bias": 0.1 * torch.randn(D, generator=g),
          L + "self_attn.q_proj.weight": 2 * r(D, D), L + "self_attn.k_proj.weight": 2 * r(D, D),
          L + "self_attn.v_proj.weight": r(D, D), L + "self_attn.o_proj.weight": r(D, D),
          L + "mlp.gate_proj.weight": r(Fn, D), L + "mlp.up_proj.weight": r(Fn, D),
          L + "mlp.down_proj.weight": r(D, Fn),
          L + "post_attention_layernorm.weight": 1 + 0.1 * torch.randn(D, generator=g)}
    if cfg["model_type"] == "chameleon":
        sd[L + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(D, generator=g)
        for n in ("q_norm", "k_norm"):
            sd[f"{L}self_attn.{n}.weight"] = 1 + 0.2 * torch.randn(h, D // h, generator=g)
            sd[f"{L}self_attn.{n}.bias"] = 0.2 * torch.randn(h, D // h, generator=g)
    return sd


def save_lantern(folder, cfg, sd, fmt="bin"):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"_from_model_config": True}, f)
    if fmt == "bin":
        torch.save(sd, os.path.join(folder, "pytorch_model.bin"))
    else:
        from safetensors.torch import save_file
        save_file(sd, os.path.join(folder, "model.safetensors"))
    return folder


# -- the reference: LANTERN's layer on the raw state dict ---------------------------------------------

def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_1d(x, pos, theta):  # x [R, T, h, hd]; transformers' Llama / Chameleon convention
    hd = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd)
    ang = pos.float()[:, None] * inv[None]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos()[None, :, None], emb.sin()[None, :, None]
    rot = torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1)
    return x * cos + rot * sin


def rope_2d_complex(x, cells, grid):  # LlamaGen: complex multiplication of interleaved pairs
    hd = x.shape[-1]
    half = hd // 2
    inv = 1.0 / 10000 ** (torch.arange(0, half, 2)[: half // 2].float() / half)
    ang = torch.cat([(cells // grid).float()[:, None] * inv, (cells % grid).float()[:, None] * inv], -1)  # [T, hd/2]
    ang = torch.where((cells < grid * grid)[:, None], ang, 0.0)
    rot = torch.polar(torch.where((cells < grid * grid)[:, None], 1.0, 0.0).expand_as(ang), ang)
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], half, 2).contiguous())
    return torch.view_as_real(xc * rot[None, :, None]).flatten(-2)


def lantern_logits(sd, cfg, hidden, vocab_ids, pos, head_rows, grid=0):
    """hidden [R, T, D], vocab_ids [R, T] (LANTERN's token ids), pos [T] -> logits [R, T, V_img]."""
    L = "layers.0."
    w = lambda k: sd[L + k].float()  # noqa: E731
    D, h = cfg["hidden_size"], cfg["num_attention_heads"]
    hd, R, T = D // h, hidden.shape[0], hidden.shape[1]
    x = torch.cat([sd["embed_tokens.weight"].float()[vocab_ids], hidden], -1) @ sd["fc.weight"].float().T
    x = x + sd["fc.bias"].float()
    res = x
    anole = cfg["model_type"] == "chameleon"
    if anole:
        x = rms(x, w("input_layernorm.weight"), cfg["rms_norm_eps"])
    q = (x @ w("self_attn.q_proj.weight").T).view(R, T, h, hd)
    k = (x @ w("self_attn.k_proj.weight").T).view(R, T, h, hd)
    v = (x @ w("self_attn.v_proj.weight").T).view(R, T, h, hd)
    if anole:
        q = F.layer_norm(q, (hd,), eps=1e-5) * w("self_attn.q_norm.weight") + w("self_attn.q_norm.bias")
        k = F.layer_norm(k, (hd,), eps=1e-5) * w("self_attn.k_norm.weight") + w("self_attn.k_norm.bias")
        q, k = rope_1d(q, pos, cfg["rope_theta"]), rope_1d(k, pos, cfg["rope_theta"])
    else:
        q, k = rope_2d_complex(q, pos, grid), rope_2d_complex(k, pos, grid)
    att = torch.einsum("rqhd,rkhd->rhqk", q, k) / hd ** 0.5
    att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    x = res + torch.einsum("rhqk,rkhd->rqhd", att, v).reshape(R, T, D) @ w("self_attn.o_proj.weight").T
    y = rms(x, w("post_attention_layernorm.weight"), cfg["rms_norm_eps"])
    x = x + (F.silu(y @ w("mlp.gate_proj.weight").T) * (y @ w("mlp.up_proj.weight").T)) @ w("mlp.down_proj.weight").T
    return x @ head_rows.float().T


def ours_logits(model, net, hidden, engine_ids, pos):
    R, T = engine_ids.shape
    mask = torch.ones(T, T, dtype=torch.bool).tril().expand(R, T, T)
    with torch.no_grad():
        emb = net.embed_tokens(model, engine_ids).float()  # what ADTTreeDrafter._embed feeds the layer
        g = net(hidden, emb, pos.expand(R, T), mask)
        return model.image_logits(g.to(model.embed_tokens(engine_ids[:1, :1]).dtype)).float()


# -- fixtures ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def anole(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("anole") / "Anole-tiny")
    hf, tok = build_tiny_chameleon(folder)
    model = specar.load_model(folder, layout="anole")
    image_ids = torch.tensor([tok.convert_tokens_to_ids(code_token_name(c)) for c in range(4)])
    cfg = anole_config(32, 4, hf.config.vocab_size)
    # LANTERN trains with a frozen copy of the target's embed_tokens (load_emb=True)
    sd = lantern_state(cfg, hf.get_input_embeddings().weight.detach(), seed=1)
    src = save_lantern(os.path.join(os.path.dirname(folder), "anole_drafter"), cfg, sd, "bin")
    return dict(folder=folder, hf=hf, model=model, cfg=cfg, sd=sd, src=src, image_ids=image_ids,
                head=hf.lm_head.weight.detach()[image_ids])


@pytest.fixture(scope="module")
def llamagen(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llamagen") / "LlamaGen-T2I-tiny"
    folder.mkdir()
    gsd = gpt_state("t2i", seed=5)
    torch.save({"model": gsd}, folder / "t2i_tiny_stage1_256.pt")  # 256 px: 16x16 codes, LANTERN's "t2i" grid
    torch.save({"model": vq_state()}, folder / "vq_ds16_t2i.pt")
    build_t5(str(folder / "flan-t5-xl"))
    model = specar.load_model(str(folder), n_head=HEADS)
    cfg = llamagen_config(DIM, HEADS, CODES)
    # LANTERN's load_emb falls back to the target's lm_head when the base folder has no index json
    sd = lantern_state(cfg, gsd["output.weight"], seed=2)
    src = save_lantern(str(folder.parent / "llamagen_drafter"), cfg, sd, "safetensors")
    return dict(folder=str(folder), model=model, cfg=cfg, sd=sd, src=src, head=gsd["output.weight"])


# -- tests -----------------------------------------------------------------------------------------------

def test_anole_converted_logits_equal_lanterns_layer(anole, tmp_path):
    m = anole["model"]
    out = convert_lantern_drafter(anole["src"], m, str(tmp_path / "eagle_drafter"))
    meta = json.load(open(os.path.join(out, "drafter.json")))
    assert meta["kind"] == "eagle" and meta["config"]["qk_norm"] and meta["config"]["input_norm"]
    assert meta["config"]["embed_rows"] == 0  # identical to the target's embeddings: the target's are used
    assert meta["training"]["weights_file"] == "pytorch_model.bin"
    net = load_eagle(m, out).float().eval()
    g = torch.Generator().manual_seed(3)
    R, T = 3, 12
    hidden = torch.randn(R, T, 32, generator=g)
    codes = torch.randint(0, 4, (R, T), generator=g)
    ref = lantern_logits(anole["sd"], anole["cfg"], hidden, anole["image_ids"][codes], torch.arange(T) + 9,
                         anole["head"])  # LANTERN's absolute positions: prompt length + j (rotary: relative)
    ours = ours_logits(m, net, hidden, codes, torch.arange(T))
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


def test_anole_own_embedding_table_is_kept(anole, tmp_path):
    sd = dict(anole["sd"])
    sd["embed_tokens.weight"] = sd["embed_tokens.weight"] + 0.5  # a drafter whose embeddings differ from the target's
    src = save_lantern(str(tmp_path / "drafter"), anole["cfg"], sd, "safetensors")
    m = anole["model"]
    out = convert_lantern_drafter(src, m, str(tmp_path / "out"))
    assert json.load(open(os.path.join(out, "drafter.json")))["config"]["embed_rows"] == 4
    net = load_eagle(m, out).float().eval()
    g = torch.Generator().manual_seed(4)
    hidden, codes = torch.randn(2, 6, 32, generator=g), torch.randint(0, 4, (2, 6), generator=g)
    ref = lantern_logits(sd, anole["cfg"], hidden, anole["image_ids"][codes], torch.arange(6), anole["head"])
    torch.testing.assert_close(ours_logits(m, net, hidden, codes, torch.arange(6)), ref, rtol=1e-4, atol=1e-4)


def test_llamagen_converted_logits_equal_lanterns_layer(llamagen, tmp_path):
    m = llamagen["model"]
    out = convert_lantern_drafter(llamagen["src"], m, str(tmp_path / "eagle_drafter"))
    c = json.load(open(os.path.join(out, "drafter.json")))["config"]
    assert c["rope_grid"] == 16 and not c["input_norm"] and not c["qk_norm"] and c["embed_rows"] == CODES
    net = load_eagle(m, out).float().eval()
    g = torch.Generator().manual_seed(5)
    R, T = 2, 40  # crosses two row boundaries of the 16-wide grid
    hidden = torch.randn(R, T, DIM, generator=g)
    codes = torch.randint(0, CODES, (R, T), generator=g)
    ref = lantern_logits(llamagen["sd"], llamagen["cfg"], hidden, codes, torch.arange(T), llamagen["head"], grid=16)
    torch.testing.assert_close(ours_logits(m, net, hidden, codes, torch.arange(T)), ref, rtol=1e-4, atol=1e-4)
    # past the grid LANTERN's rotary table is zero rows (queries and keys vanish): same here
    pos = torch.arange(250, 262)
    ref = lantern_logits(llamagen["sd"], llamagen["cfg"], hidden[:, :12], codes[:, :12], pos, llamagen["head"], 16)
    torch.testing.assert_close(ours_logits(m, net, hidden[:, :12], codes[:, :12], pos), ref, rtol=1e-4, atol=1e-4)


def test_generate_with_converted_drafters_is_exact(anole, llamagen, tmp_path):
    for name, d, prompt in (("anole", anole, "a red cat"), ("llamagen", llamagen, "a red cat")):
        m = d["model"]
        out = convert_lantern_drafter(d["src"], m, str(tmp_path / name))
        res = specar.generate(m, prompt, backend=specar.make_backend("adt_tree", drafter=out), seed=3, batch_size=2)
        H, W = m.geometry.height, m.geometry.width
        assert res.tokens.shape == (2, H, W) and len(res.images) == 2
        # lossless: greedy decoding gives the AR argmax image
        a = specar.generate(m, prompt, backend="ar", sampling=dict(temperature=0.0), seed=1).tokens
        b = specar.generate(m, prompt, backend=specar.make_backend("adt_tree", drafter=out),
                            sampling=dict(temperature=0.0), seed=2).tokens
        assert torch.equal(a, b), name


def test_default_folder_and_cli(llamagen, tmp_path):
    folder = str(tmp_path / "model")
    shutil.copytree(llamagen["folder"], folder)
    env = dict(os.environ, PYTHONPATH=SPECAR_PARENT, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "specar", "convert-drafter", "--kind", "lantern", llamagen["src"],
                        "--model", folder, "--n-head", str(HEADS)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert os.path.isfile(os.path.join(folder, "eagle_drafter", "drafter.safetensors"))
    m = specar.load_model(folder, n_head=HEADS)
    res = specar.generate(m, "a red cat", backend="adt_tree", seed=1)  # found as <model folder>/eagle_drafter
    assert res.tokens.shape == (16, 16)
    # the converted drafter is bound to this model's weights
    with pytest.raises(ValueError, match="trained for model"):
        load_eagle(_other_llamagen(tmp_path), os.path.join(folder, "eagle_drafter"))


def _other_llamagen(tmp_path):
    folder = tmp_path / "other"
    folder.mkdir()
    torch.save({"model": gpt_state("t2i", seed=6)}, folder / "t2i_tiny_stage1_256.pt")
    torch.save({"model": vq_state()}, folder / "vq_ds16_t2i.pt")
    build_t5(str(folder / "flan-t5-xl"))
    return specar.load_model(str(folder), n_head=HEADS)


def test_unconverted_lantern_folder_names_the_command(anole):
    with pytest.raises(ValueError, match="convert-drafter --kind lantern"):
        load_eagle(anole["model"], anole["src"])


def _variant(tmp_path, d, name, cfg=None, sd=None, fmt="bin"):
    return save_lantern(str(tmp_path / name), cfg or d["cfg"], sd if sd is not None else d["sd"], fmt)


def test_refusals_name_the_file_and_the_mismatch(anole, llamagen, tmp_path):
    a, lg = anole["model"], llamagen["model"]
    out = str(tmp_path / "out")
    # wrong vocabulary: a drafter for a bigger head (config and embed_tokens agree with each other)
    cfg = dict(anole["cfg"], vocab_size=anole["cfg"]["vocab_size"] + 8)
    sd = dict(anole["sd"], **{"embed_tokens.weight": torch.randn(cfg["vocab_size"], 32)})
    src = _variant(tmp_path, anole, "vocab", cfg, sd)
    with pytest.raises(ValueError, match=r"pytorch_model\.bin: vocab_size \d+ \(config\.json, embed_tokens rows\) "
                                         r"but the model's head has \d+"):
        convert_lantern_drafter(src, a, out)
    # a tensor whose shape disagrees with config.json
    sd = dict(anole["sd"], **{"layers.0.mlp.up_proj.weight": torch.randn(48, 32)})
    src = _variant(tmp_path, anole, "shape", sd=sd)
    with pytest.raises(ValueError, match=r"pytorch_model\.bin does not match its config\.json.*up_proj.*\(48, 32\)"):
        convert_lantern_drafter(src, a, out)
    # missing q_norm (a LlamaGen-style layer under an Anole config)
    sd = {k: v for k, v in anole["sd"].items() if "q_norm" not in k}
    src = _variant(tmp_path, anole, "missing", sd=sd)
    with pytest.raises(ValueError, match=r"missing \(2\): layers\.0\.self_attn\.q_norm"):
        convert_lantern_drafter(src, a, out)
    # hidden size of another model
    cfg = dict(anole["cfg"], hidden_size=64, intermediate_size=128)
    sd = lantern_state(cfg, torch.randn(cfg["vocab_size"], 64), seed=3)
    src = _variant(tmp_path, anole, "width", cfg, sd)
    with pytest.raises(ValueError, match="hidden_size 64 but the model's hidden size is 32"):
        convert_lantern_drafter(src, a, out)
    # family: an Anole drafter for a LlamaGen model
    with pytest.raises(ValueError, match="is a LANTERN anole drafter; the loaded model"):
        convert_lantern_drafter(anole["src"], lg, out)
    # LlamaGen grid: a t2i2 (32x32) drafter for a 16x16 model
    src = _variant(tmp_path, llamagen, "grid", dict(llamagen["cfg"], input_type="t2i2"), fmt="safetensors")
    with pytest.raises(ValueError, match=r"input_type 32x32 codes.*16x16"):
        convert_lantern_drafter(src, lg, out)
    # corrupt weights
    src = _variant(tmp_path, anole, "corrupt")
    with open(os.path.join(src, "pytorch_model.bin"), "r+b") as f:
        f.truncate(100)
    with pytest.raises(ValueError, match=r"pytorch_model\.bin cannot be read with torch\.load\(weights_only=True\)"
                                         r".*corrupt"):
        convert_lantern_drafter(src, a, out)
    src = _variant(tmp_path, llamagen, "corrupt-st", fmt="safetensors")
    with open(os.path.join(src, "model.safetensors"), "r+b") as f:
        f.truncate(40)
    with pytest.raises(ValueError, match=r"model\.safetensors is not a valid safetensors file"):
        convert_lantern_drafter(src, lg, out)
    # a pickle that is not a plain state dict: refused, never unpickled
    src = _variant(tmp_path, anole, "pickle")
    torch.save({"state": anole["sd"], "obj": NotATensor()}, os.path.join(src, "pytorch_model.bin"))
    with pytest.raises(ValueError, match=r"pytorch_model\.bin cannot be read with torch\.load\(weights_only=True\)"
                                         r".*does not unpickle.*convert it once"):
        convert_lantern_drafter(src, a, out)
    src = _variant(tmp_path, anole, "extras")
    torch.save(dict(anole["sd"], step=3), os.path.join(src, "pytorch_model.bin"))
    with pytest.raises(ValueError, match=r"pytorch_model\.bin does not hold a plain state dict"):
        convert_lantern_drafter(src, a, out)
    # unsupported layouts are named
    src = _variant(tmp_path, anole, "gqa", dict(anole["cfg"], num_key_value_heads=2))
    with pytest.raises(ValueError, match="num_key_value_heads 2 != num_attention_heads"):
        convert_lantern_drafter(src, a, out)
    assert not os.path.exists(out)


class NotATensor:
    pass
