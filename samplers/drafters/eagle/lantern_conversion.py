"""LANTERN's released EAGLE drafters (github.com/jadohu/LANTERN; Hugging Face jadohu/anole_drafter,
jadohu/llamagen_drafter, jadohu/llamagen2_drafter) -> our drafter files (``python -m specar convert-drafter --kind
lantern``): docs/ADT_TREE.md, "LANTERN's released drafters", has the command, the checks and what the conversion
reproduces (Anole's and LlamaGen's layers against ours).

The layout read: LANTERN at commit 3a56e45 (``models/drafters/cnets_anole.py``, ``models/drafters/cnets_llamagen.py``,
``models/ea_model_{anole,llamagen}.py``, ``data/configs/{anole,llamagen_t2i,llamagen_t2i2}_config.json``): state-dict
keys without prefix (``embed_tokens.weight``, ``fc.weight``, ``fc.bias``, ``layers.0.*``), ``fc`` with a bias unless
config ``"bias": false``; LlamaGen's grid fixed by ``input_type`` (t2i: 16x16, t2i2: 32x32, c2i: 24x24), image code j
at grid cell j. Our network (samplers/drafters/eagle/network.py) permutes LlamaGen's q/k rows per head from
interleaved pairs to rotate-half pairs (the same rotation, dot products unchanged).
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from ....model_loaders.files.checkpoints import read_json_object
from ....model_loaders.files.drafter_files import CONFIG_FILE, WEIGHTS_FILE, check_shapes, save_drafter
from .network import FOLDER, KIND, EagleConfig, EagleNet

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
GRIDS = {"t2i": 16, "t2i2": 32, "c2i": 24}  # LANTERN's cnets_llamagen: block_size by input_type
SOURCE = "github.com/jadohu/LANTERN@3a56e451dd5ebfa1903d044f754c68c420de27a9"
COMMAND = "python -m specar convert-drafter --kind lantern {src} --model {model} --out {out}"


def is_lantern_folder(folder: Optional[str]) -> bool:
    return bool(folder) and os.path.isfile(os.path.join(folder, "config.json")) and \
        any(os.path.isfile(os.path.join(folder, f)) for f in WEIGHT_FILES)


def unconverted_lantern_error(model, folder: str) -> ValueError:
    """The error for a released LANTERN drafter passed where our drafter files are expected."""
    name = getattr(model, "folder", None) or model.name
    out = os.path.join(getattr(model, "folder", None) or "<model folder>", FOLDER)
    return ValueError(f"{folder} holds a LANTERN drafter (config.json + weights), not SpecAR's {CONFIG_FILE} / "
                      f"{WEIGHTS_FILE}; convert it once with: " + COMMAND.format(src=folder, model=name, out=out))


def read_lantern(folder: str):
    """(config dict, state dict, weights path) of a LANTERN drafter folder. Errors name the file."""
    cfg_path = os.path.join(folder, "config.json")
    if not os.path.isfile(cfg_path):
        raise ValueError(f"{folder} is not a LANTERN drafter folder: no config.json")
    cfg = read_json_object(cfg_path)
    path = next((os.path.join(folder, f) for f in WEIGHT_FILES if os.path.isfile(os.path.join(folder, f))), None)
    if path is None:
        raise ValueError(f"{folder} has config.json but no weights ({' or '.join(WEIGHT_FILES)})")
    return cfg, load_weights(path), path


def load_weights(path: str) -> dict:
    """A plain state dict from model.safetensors, or from pytorch_model.bin through
    ``torch.load(weights_only=True)`` only; anything else is refused naming the file."""
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file
        try:
            state = load_file(path)
        except Exception as e:  # header or data corrupt
            raise ValueError(f"{path} is not a valid safetensors file ({e}); download it again") from e
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # UnpicklingError for pickled objects, RuntimeError for a corrupt archive
            why = str(e).splitlines()[0][:200]
            raise ValueError(
                f"{path} cannot be read with torch.load(weights_only=True) ({why}): the file is corrupt (download "
                f"it again) or holds more than a plain state dict of tensors, which SpecAR does not unpickle. If "
                f"the file is intact and you trust it, convert it once in a Python session you control: "
                f"`import torch, safetensors.torch as st; sd = torch.load(PATH, weights_only=False); "
                f"st.save_file({{k: v.contiguous() for k, v in sd.items()}}, 'model.safetensors')` next to its "
                f"config.json, remove pytorch_model.bin, and run convert-drafter again") from e
    if not isinstance(state, dict) or not state or \
            not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise ValueError(f"{path} does not hold a plain state dict of tensors (LANTERN saves its drafter's "
                         f"state_dict(): names -> tensors)")
    return state


def _get(cfg: dict, key: str, path: str, kind=int):
    if key not in cfg:
        raise ValueError(f"{path} has no {key!r}")
    v = cfg[key]
    if kind is int and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
        raise ValueError(f"{path}: {key} must be a positive integer, got {v!r}")
    return v


def parse_config(cfg: dict, path: str) -> dict:
    """What we need of LANTERN's config.json, with everything our layer cannot compute refused."""
    mt = cfg.get("model_type")
    family = {"chameleon": "anole", "llama": "llamagen"}.get(mt)
    if family is None:
        raise ValueError(f"{path}: model_type {mt!r}; LANTERN's drafters are 'chameleon' (Anole) or 'llama' (LlamaGen)")
    p = {"family": family, "hidden": _get(cfg, "hidden_size", path), "heads": _get(cfg, "num_attention_heads", path),
         "ffn": _get(cfg, "intermediate_size", path), "vocab": _get(cfg, "vocab_size", path),
         "eps": float(cfg.get("rms_norm_eps", 1e-6)), "theta": float(cfg.get("rope_theta", 10000.0)),
         "fc_bias": bool(cfg.get("bias", True)), "grid": 0}  # grid 0: 1-D rotary (LlamaGen: set below)
    if p["hidden"] % p["heads"] or (p["hidden"] // p["heads"]) % (4 if family == "llamagen" else 2):
        raise ValueError(f"{path}: hidden_size {p['hidden']} does not split into {p['heads']} heads of an even width")
    unsupported = []
    if cfg.get("num_hidden_layers", 1) != 1:
        unsupported.append(f"num_hidden_layers {cfg.get('num_hidden_layers')} (EAGLE: 1)")
    if cfg.get("num_key_value_heads", p["heads"]) != p["heads"]:
        unsupported.append(f"num_key_value_heads {cfg.get('num_key_value_heads')} != num_attention_heads")
    if cfg.get("hidden_act", "silu") != "silu":
        unsupported.append(f"hidden_act {cfg.get('hidden_act')!r}")
    if cfg.get("rope_scaling") is not None:
        unsupported.append(f"rope_scaling {cfg.get('rope_scaling')!r}")
    for k in ("attention_bias", "mlp_bias", "qkv_bias"):
        if cfg.get(k):
            unsupported.append(f"{k} true")
    if unsupported:
        raise ValueError(f"{path}: not a layout this converter reads ({'; '.join(unsupported)})")
    if family == "llamagen":
        it = cfg.get("input_type")
        if it not in GRIDS:
            raise ValueError(f"{path}: input_type {it!r}; LANTERN's LlamaGen drafters use one of "
                             f"{', '.join(GRIDS)} (it fixes the 2D rotary grid)")
        p["grid"], p["theta"] = GRIDS[it], 10000.0  # cnets_llamagen hard-codes rope_base 10000
    return p


def lantern_shapes(p: dict) -> dict:
    """The state dict LANTERN's Model(config) has (load_state_dict(strict=True) in its ea_model)."""
    D, h, F, V = p["hidden"], p["heads"], p["ffn"], p["vocab"]
    L = "layers.0."
    s = {"embed_tokens.weight": (V, D), "fc.weight": (D, 2 * D),
         L + "self_attn.q_proj.weight": (D, D), L + "self_attn.k_proj.weight": (D, D),
         L + "self_attn.v_proj.weight": (D, D), L + "self_attn.o_proj.weight": (D, D),
         L + "mlp.gate_proj.weight": (F, D), L + "mlp.up_proj.weight": (F, D), L + "mlp.down_proj.weight": (D, F),
         L + "post_attention_layernorm.weight": (D,)}
    if p["fc_bias"]:
        s["fc.bias"] = (D,)
    if p["family"] == "anole":
        s[L + "input_layernorm.weight"] = (D,)
        for n in ("q_norm", "k_norm"):
            s[f"{L}self_attn.{n}.weight"] = (h, D // h)
            s[f"{L}self_attn.{n}.bias"] = (h, D // h)
    return s


def check_lantern_state(state: dict, p: dict, path: str) -> None:
    want = lantern_shapes(p)
    got = {k: tuple(v.shape) for k, v in state.items()}
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    wrong = sorted(k for k in set(want) & set(got) if got[k] != tuple(want[k]))
    problems = []
    for what, items in (("missing", missing), ("unexpected", extra), ("wrong shape", wrong)):
        if items:
            shown = ", ".join(k + (f" {got[k]} vs {tuple(want[k])} from config.json" if what == "wrong shape" else "")
                              for k in items[:4])
            problems.append(f"{what} ({len(items)}): {shown}{' ...' if len(items) > 4 else ''}")
    if problems:
        raise ValueError(f"{path} does not match its config.json ({p['family']} drafter): " + "; ".join(problems))
    bad = [k for k, v in state.items() if not v.is_floating_point() or not bool(torch.isfinite(v).all())]
    if bad:
        raise ValueError(f"{path}: tensors with non-float or non-finite values: {bad[:4]}")


def target_vocab(model, p: dict, path: str):
    """(full vocabulary size of the target's head, engine id -> vocabulary id), checked against the drafter."""
    fam = getattr(model, "family", None)
    want = {"anole": "chameleon", "llamagen": "llamagen"}[p["family"]]
    if fam != want:
        raise ValueError(f"{path} is a LANTERN {p['family']} drafter; the loaded model {model.name!r} is "
                         f"{fam or 'not a LANTERN family'} (LANTERN's drafters: Anole, LlamaGen)")
    if fam == "chameleon":
        if getattr(model, "layout", "anole") != "anole":
            raise ValueError(f"{path} is an Anole drafter; load the model with layout='anole' "
                             f"(got layout {model.layout!r})")
        full = int(model.model.lm_head.weight.shape[0])
        ids = model._engine_to_model.detach().cpu().long()
    else:
        full = int(model.geometry.vocab_size)
        ids = torch.arange(full)
        geo = model.geometry
        if (geo.height, geo.width) != (p["grid"], p["grid"]):
            raise ValueError(f"{path}: input_type {p['grid']}x{p['grid']} codes (2D rotary grid), but the model "
                             f"generates {geo.height}x{geo.width} codes; use the drafter of that resolution")
    if p["vocab"] != full:
        raise ValueError(f"{path}: vocab_size {p['vocab']} (config.json, embed_tokens rows) but the model's head "
                         f"has {full} entries: a drafter for another vocabulary")
    if p["hidden"] != model.hidden_size:
        raise ValueError(f"{path}: hidden_size {p['hidden']} but the model's hidden size is {model.hidden_size}")
    return full, ids


def _interleaved_to_half(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a q/k projection reordered per head: (0, 2, 4, ..., 1, 3, 5, ...)."""
    D = w.shape[0]
    hd = D // heads
    perm = torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])
    idx = (torch.arange(heads)[:, None] * hd + perm[None]).flatten()
    return w[idx]


def convert_lantern(folder: str, model, attn_band: Optional[int] = None):
    """(EagleConfig dict, our tensors, info) of a LANTERN drafter folder for `model`."""
    cfg, state, path = read_lantern(folder)
    p = parse_config(cfg, os.path.join(folder, "config.json"))
    check_lantern_state(state, p, path)
    _, ids = target_vocab(model, p, path)
    D, h = p["hidden"], p["heads"]
    geo = model.geometry
    seq_len = geo.seq_len
    band = int(attn_band or max(2 * geo.row_stride, 8))
    if band < 1:
        raise ValueError(f"attn_band must be >= 1, got {attn_band!r}")
    L = "layers.0."
    g = lambda k: state[L + k]  # noqa: E731
    q, k, v = g("self_attn.q_proj.weight"), g("self_attn.k_proj.weight"), g("self_attn.v_proj.weight")
    if p["family"] == "llamagen":
        q, k = _interleaved_to_half(q, h), _interleaved_to_half(k, h)
    fc = state["fc.weight"]
    t = {"fc.weight": torch.cat([fc[:, D:], fc[:, :D]], 1),  # LANTERN: [embedding; hidden] -> ours [feature; embedding]
         "block.attn.qkv.weight": torch.cat([q, k, v]), "block.attn.o.weight": g("self_attn.o_proj.weight"),
         "block.mlp_norm.weight": g("post_attention_layernorm.weight"),
         "block.gate_up.weight": torch.cat([g("mlp.gate_proj.weight"), g("mlp.up_proj.weight")]),
         "block.down.weight": g("mlp.down_proj.weight")}
    if p["fc_bias"]:
        t["fc.bias"] = state["fc.bias"]
    if p["family"] == "anole":
        t["block.attn_norm.weight"] = g("input_layernorm.weight")
        for n in ("q_norm", "k_norm"):
            for s in ("weight", "bias"):
                t[f"block.attn.{n}.{s}"] = g(f"self_attn.{n}.{s}")
    rows = state["embed_tokens.weight"][ids]
    with torch.no_grad():
        mine = model.embed_tokens(torch.arange(len(ids), device=model.device)).detach().cpu()
    lo = rows.dtype if rows.element_size() <= mine.element_size() else mine.dtype
    own = not torch.equal(rows.to(lo), mine.to(lo))
    if own:
        t["embed.weight"] = rows
    ec = EagleConfig(hidden_size=D, num_heads=h, intermediate_size=p["ffn"], attn_band=min(band, seq_len),
                     max_positions=seq_len + 64, qk_norm=p["family"] == "anole",
                     input_norm=p["family"] == "anole", norm_eps=p["eps"], rope_theta=p["theta"],
                     rope_grid=p["grid"], embed_rows=len(ids) if own else 0, fc_bias=p["fc_bias"])
    check_shapes(path, t, EagleNet(EagleConfig.from_dict(ec.to_dict())).expected_shapes())
    info = {"converted_from": os.path.abspath(folder), "source_format": f"LANTERN {p['family']} drafter ({SOURCE})",
            "weights_file": os.path.basename(path), "embedding": "own table" if own else "the target's (identical)"}
    return ec.to_dict(), {k: v.contiguous() for k, v in t.items()}, info


def convert_lantern_drafter(folder: str, model, out: Optional[str] = None, attn_band: Optional[int] = None) -> str:
    """Convert and write drafter.json + drafter.safetensors to `out` (default <model folder>/eagle_drafter)."""
    if out is None:
        base = getattr(model, "folder", None)
        if base is None:
            raise ValueError("the model has no folder; pass --out")
        out = os.path.join(base, FOLDER)
    if os.path.abspath(out) == os.path.abspath(folder):
        raise ValueError(f"--out {out} is the LANTERN folder itself; write the converted drafter elsewhere")
    config, tensors, info = convert_lantern(folder, model, attn_band)
    save_drafter(out, KIND, model, tensors, config, training=info)
    return out


__all__ = ["convert_lantern", "convert_lantern_drafter", "read_lantern", "load_weights", "parse_config",
           "lantern_shapes", "is_lantern_folder", "unconverted_lantern_error", "COMMAND"]
