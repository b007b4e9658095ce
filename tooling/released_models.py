"""The released 7-8B image models at their published shapes, built with random weights by each family's own classes
and loaded through the family's loader (gpu-check's images stage): Lumina-mGPT 2.0 (our own decoder, `lumina2`),
Janus-Pro-7B, Emu3-Gen and GLM-Image's AR stage (transformers' classes, grouped-query attention as released; GLM-Image
at 1024x1024: its 16x16 preview grid then its 32x32 image grid, 1,280 positions, tokens only: no DiT).

The weights are built in memory on the device (no 15 GB file written and read back): the folder holds what the
loader reads besides them (config.json, tokenizer, generation config, image tokenizer), and while loading,
`weights_in_memory` puts random weights in place of the two functions that read weight files
(transformers' `from_pretrained` through `hf_files.load_pretrained`, Lumina-mGPT 2.0's `lumina2.load_weights`;
GLM-Image's folder check skips its weight files);
every other line of the loader runs as for a real folder. `tiny`: the same geometry (image grid, sequence length,
code and text vocabularies, CFG rows) with tiny widths and 2 layers, for the dry run on the CPU.

Where a number comes from: each model's `source`; what is assumed rather than read from a released config.json:
its `assumed` (None where every number is read). Images are noise: the speed and memory are what the shapes cost.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Optional

import torch

from .real_size_builders import GLM_TINY, SPECS, Spec, _word_tokenizer, build_folder

TINY_LAYERS = 2


@dataclass(frozen=True)
class Released:
    spec: Spec  # real_size_builders' description: family, checkpoint, source, dims, layers
    assumed: Optional[str]  # what is not read from the released config.json (None: nothing)
    tiny: dict  # the dry run's widths (every geometry number kept)
    pixels_per_code: int  # the image tokenizer's downsampling
    row_end: bool  # a row-end token after each row of codes
    preview_grid: int = 0  # a two-grid model (GLM-Image): the side of the grid sampled before the image's

    def positions(self, rows=None) -> int:
        """Sequence positions of the first `rows` rows of an image at the released size (None: the whole image;
        a two-grid model: rows in the order sampled, the preview grid's then the image grid's)."""
        grid, p = self.spec.dims["image"] // self.pixels_per_code, self.preview_grid
        rows = p + grid if rows is None else rows
        return min(rows, p) * p + min(grid, max(rows - p, 0)) * (grid + int(self.row_end))


RELEASED = {
    "janus-pro-7b": Released(
        Spec("janus", "deepseek-community/Janus-Pro-7B",
             "language model: DeepSeek-LLM-7B (Janus-Pro-7B's base): hidden 4096, 30 layers, 32 heads, "
             "intermediate 11008, vocab 102400; vision encoder and generation VQ as Janus-Pro-1B's config.json "
             "(real_size_builders.SPECS['janus-pro-1b']): 384 px, 24x24 codes of 16384",
             dict(SPECS["janus-pro-1b"].dims, hidden=4096, heads=32, kv=32, ffn=11008), 30, 30),
        "the language model's numbers are DeepSeek-LLM-7B's (no grouped KV heads: num_key_value_heads = 32, as that "
        "release), not read from Janus-Pro-7B's own config.json here",
        dict(hidden=32, heads=4, kv=4, ffn=64, v_hidden=16, v_layers=1, v_heads=2, vq_ch=32), 16, False),
    "emu3-gen": Released(
        dataclasses.replace(SPECS["emu3-gen"], run_layers=32), None,
        dict(hidden=64, heads=8, kv=2, ffn=128, vq_base=32, vq_blocks=1), 8, True),
    "lumina-mgpt-2-7b": Released(
        Spec("lumina2", "Alpha-VLLM/Lumina-mGPT-2.0",
             "docs/MODELS.md (Lumina-mGPT 2.0 memory): hidden 4096, 32 layers, 32 heads, intermediate 11008; image "
             "codes at ids 155000.. (16384 MoVQGAN codes), 768 px, 96x96 codes with a newline per row",
             dict(hidden=4096, heads=32, kv=32, ffn=11008, vocab=172032, codes=16384, image=768, groups=1), 32, 32),
        "vocab_size 172032 (at least 171384; the real value is not known here), num_key_value_heads 32 and "
        "model_parallel_size 1 (Chameleon-7B's)",
        dict(hidden=32, heads=4, kv=4, ffn=64), 8, True),
    "emu3.5-image": Released(
        Spec("emu35", "BAAI/Emu3.5-Image",
             "docs/MODELS.md (Emu3.5): 34.1 B parameters (31.2 B transformer, 2.9 B embeddings), vocabulary 282926 "
             "(151643 text ranks, 211 special tokens, 131072 visual codes), 16x IBQ codes, 1024x1024 = 64x64 codes "
             "with a row end each",
             dict(hidden=5120, heads=64, kv=8, head_dim=128, ffn=25600, vocab=282926, codes=131072, image=1024),
             64, 64),
        "64 layers, 64 query / 8 key-value heads of 128, intermediate 25600 (Qwen3-32B's shape, which gives the "
        "report's 31.2 B transformer parameters; hidden 5120 follows from its 2.9 B embeddings over 2 x 282926 rows); "
        "not read from the released config.json here",
        dict(hidden=32, heads=4, kv=2, head_dim=16, ffn=64), 16, True),
    "glm-image": Released(
        dataclasses.replace(SPECS["glm-image"], run_layers=40),
        "every width is transformers' GlmImageConfig default (documented as zai-org/GLM-Image's, not read from its "
        "config.json here); the sampling (temperature 0.9, top-p 0.75) as issue 54 quotes the checkpoint's; a "
        "word-level stand-in for its text tokenizer (the prompt's length differs); the AR stage only (no DiT)",
        GLM_TINY, 32, False, preview_grid=16),
}


def released_names() -> list:
    return list(RELEASED)


def _random_hf(cls, folder, device, dtype, quantize=None, **_):
    """In place of hf_files.load_pretrained: `cls` from the folder's config with random weights, built on `device`
    (transformers' own initialisation), quantized as the loader would."""
    from ..model_loaders.files.hf_files import transformers_version
    from ..model_loaders.precision.quantize import check_mode, quantize_module
    config = cls.config_class.from_pretrained(folder)
    with torch.device(device):
        model = cls._from_config(config, **{"dtype" if transformers_version() >= (4, 56) else "torch_dtype": dtype})
    quantize_module(model, check_mode(quantize))
    return model.eval()


def _random_lumina2(folder, c, dtype, device, head_rows):
    """In place of lumina2.load_weights: the net allocated on `device` (no float32 copy) with random weights and the
    image rows of the head only, as the loader keeps them."""
    from torch import nn

    from ..model_loaders.families.lumina2 import Lumina2Net
    from .shapes import random_init_
    with torch.device("meta"):
        net = Lumina2Net(c)
        net.lm_head = nn.Linear(c.dim, head_rows.stop - head_rows.start, bias=False)
    return random_init_(net.to(dtype=dtype).to_empty(device=device), device).eval()


@contextlib.contextmanager
def weights_in_memory():
    """Inside: the families' weight readers build random weights on the device instead (restored after)."""
    from ..model_loaders.families import glm_image_folder, hf_common, lumina2
    saved = hf_common.load_pretrained, lumina2.load_weights, glm_image_folder.missing_weights
    hf_common.load_pretrained, lumina2.load_weights = _random_hf, _random_lumina2
    glm_image_folder.missing_weights = lambda *_: []  # GLM-Image's folder check: the weights come from memory
    try:
        yield
    finally:
        hf_common.load_pretrained, lumina2.load_weights, glm_image_folder.missing_weights = saved


def _lumina2_folder(d: dict, layers: int, folder: str) -> None:
    """What Lumina2ImageModel reads besides the decoder weights: config.json with the authors' keys, a tokenizer with
    the layout's tokens, and a MoVQGAN checkpoint with the real codebook (16384 codes) at tiny widths (its decode
    is not what the stage times)."""
    from ..model_loaders.families import lumina2 as l2
    from ..model_loaders.families.chameleon import lumina_size_token
    from ..model_loaders.families.lumina2_vq import MoVQDecoder
    os.makedirs(folder, exist_ok=True)
    n = d["image"] // l2.LUMINA_PATCH
    specials = ["<|endoftext|>", l2.IMAGE_START, l2.IMAGE_END, l2.SEP, l2.NEWLINE, lumina_size_token(n)]
    _word_tokenizer(64, specials, eos_token="<|endoftext|>").save_pretrained(folder)
    cfg = dict(architectures=["ChameleonXLLMXForConditionalGeneration"], model_type="chameleon",
               vocab_size=d["vocab"], hidden_size=d["hidden"], intermediate_size=d["ffn"], num_hidden_layers=layers,
               num_attention_heads=d["heads"], num_key_value_heads=d["kv"], hidden_act="silu",
               max_position_embeddings=10240, rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
               model_parallel_size=d["groups"], swin_norm=False, attention_bias=False, mlp_bias=False,
               tie_word_embeddings=False, torch_dtype="bfloat16")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    vq = MoVQDecoder(n_embed=d["codes"], embed_dim=4, z_channels=4, widths=[32] * 4, n_blocks=1)
    torch.save(vq.state_dict(), os.path.join(folder, l2.VQ_FILES[1]))


def _emu35_folder(d: dict, layers: int, folder: str) -> None:
    """What Emu35ImageModel reads besides the decoder weights: config.json with the reference's keys, the two
    tokenizer files at the release's numbering (151643 ranks: the 256 bytes, then unreachable fillers) and a
    VisionTokenizer with the real codebook (131072 codes) at tiny widths (its decode is not what the stage times)."""
    import yaml
    from safetensors.torch import save_file

    from ..model_loaders.families.chameleon_vqgan import VQGANDecoder
    vq_dir = os.path.join(folder, "vision_tokenizer")
    os.makedirs(vq_dir, exist_ok=True)
    filler = b"\xff\xfe"  # never formed from UTF-8 text
    with open(os.path.join(folder, "emu3.tiktoken"), "w") as f:
        f.writelines(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256))
        f.writelines(f"{base64.b64encode(filler + r.to_bytes(3, 'big')).decode()} {r}\n" for r in range(256, 151643))
    with open(os.path.join(folder, "emu3_vision_tokens.txt"), "w") as f:
        f.write("<|image token|>\n<|image start|>\n<|image end|>\n")
        f.writelines(f"<|visual token {i:06d}|>\n" for i in range(d["codes"]))
    cfg = dict(architectures=["Emu3ForCausalLM"], model_type="Emu3", vocab_size=d["vocab"], hidden_size=d["hidden"],
               intermediate_size=d["ffn"], num_hidden_layers=layers, num_attention_heads=d["heads"],
               num_key_value_heads=d["kv"], head_dim=d["head_dim"], hidden_act="silu", max_position_embeddings=32768,
               rms_norm_eps=1e-5, rope_theta=1000000.0, rope_scaling=None, tie_word_embeddings=False,
               bos_token_id=151849, eol_token_id=151846, img_token_id=151851, boi_token_id=151852,
               torch_dtype="bfloat16")  # the release's ids (its logits processor's constants)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    vq = dict(embed_dim=4, n_embed=d["codes"], ddconfig=dict(z_channels=4, ch=32, ch_mult=[1] * 5, num_res_blocks=0,
                                                              resolution=1024, attn_resolutions=[], out_ch=3))
    with open(os.path.join(vq_dir, "config.yaml"), "w") as f:
        yaml.safe_dump(vq, f)
    dec = VQGANDecoder(vq["n_embed"], 4, 4, 32, [1] * 5, 0, 1024)
    save_file({k: v.contiguous() for k, v in dec.state_dict().items()}, os.path.join(vq_dir, "model.safetensors"))


def _lumina2_weights(folder: str, dtype, family: str = "lumina2") -> None:
    """Random decoder weights in the release's format (model.safetensors, the full head) beside the folder's
    config.json: what `saved` writes for Lumina-mGPT 2.0 (and Emu3.5, the same tensor names)."""
    from safetensors.torch import save_file

    from ..model_loaders.families.emu35 import Emu35Config
    from ..model_loaders.families.lumina2 import Lumina2Config, Lumina2Net
    from .shapes import random_init_
    with open(os.path.join(folder, "config.json")) as f:
        c = (Emu35Config if family == "emu35" else Lumina2Config)(json.load(f), folder)
    with torch.device("meta"):
        net = Lumina2Net(c)
    net = random_init_(net.to(dtype=dtype).to_empty(device="cpu"), "cpu")
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, os.path.join(folder, "model.safetensors"))


def build_released(name: str, workdir: str, device, dtype, tiny: bool = False, saved: bool = False):
    """(model, description) of `name` (RELEASED): its folder written under `workdir`, loaded by `specar.load_model`:
    without weights, random ones built on `device` in `dtype` while loading (weights_in_memory); `saved`: random
    weights written in the family's file format and read back by the loader as a real checkpoint's (slow at the
    released sizes: the weights are built on the CPU). Random-weight drafters of the model's width for the trained
    backends (hawk, adt_tree, spatial)."""
    from ..model_loaders.registry import load_model
    if name not in RELEASED:
        raise ValueError(f"unknown released model {name!r}; allowed: {', '.join(RELEASED)}")
    r = RELEASED[name]
    dims = {**r.spec.dims, **r.tiny} if tiny else r.spec.dims
    layers = TINY_LAYERS if tiny else r.spec.layers
    folder = os.path.join(workdir, name)
    own = r.spec.family in ("lumina2", "emu35")  # our own decoders: their folders written here
    if own:
        (_lumina2_folder if r.spec.family == "lumina2" else _emu35_folder)(dims, layers, folder)
        if saved:
            _lumina2_weights(folder, dtype, r.spec.family)
    else:
        build_folder(name, workdir, layers=layers, spec=r.spec, dims=dims, weights=saved, dtype=dtype)
    with open(os.path.join(folder, "real_size.json")) if not own else contextlib.nullcontext() as f:
        load = json.load(f)["load"] if f else {}  # the builder's load options (GLM-Image: its size)
    with contextlib.nullcontext() if saved else weights_in_memory():
        model = load_model(folder, device=device, dtype=dtype, **load)
    model.random_drafter_seed = 0  # no trained drafter exists for random weights: random ones of the right width
    geo = model.geometry
    first = model.preceding_stage()
    return model, {"model": name, "checkpoint": r.spec.checkpoint, "family": model.family, "source": r.spec.source,
                   "assumed": r.assumed, "tiny_widths": tiny, "layers": layers, "layers_released": r.spec.layers,
                   "hidden": dims["hidden"], "heads": dims["heads"], "kv_heads": dims["kv"],
                   "grid": [geo.height, geo.width], "row_end": geo.row_end, "seq_len": geo.seq_len,
                   "preview_grid": None if first is None else [first.geometry.height, first.geometry.width],
                   "positions": geo.seq_len + (0 if first is None else first.geometry.seq_len),
                   "image_codes": geo.vocab_size,
                   "parameters": sum(p.numel() for p in model.torch_module().parameters()),
                   "weights": "random, saved in the family's format and loaded by its loader" if saved else
                   "random, built in memory on the device; loaded through the family loader"}


__all__ = ["RELEASED", "Released", "build_released", "released_names", "weights_in_memory"]
