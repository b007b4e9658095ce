"""`python -m specar real-size`: each family at the real width of a released checkpoint, checked.

For each family, a random-weight model is built from the published configuration of a real
checkpoint (dimensions in `SPECS`, with their source), saved in the family's real folder format
(transformers `save_pretrained` + tokenizer files, Chameleon's `vqgan.yaml` / `vqgan.ckpt`, LlamaGen's
`c2i_*.pt` / `vq_ds16_*.pt`), loaded through `specar.load_model` (the code path of a real folder),
then, in a fresh process per (family, precision) so that its peak memory is its own:
`generate` at the real resolution with a speculative backend for a few steps, the VQ decoder on a
full grid of codes at the real image size, and forwards of 1 and 17 tokens (CFG: 2 rows) timed.

Layers: a model that does not fit the memory budget runs with the real widths and FEWER layers
(`--layers`, recorded as "layers run / real"); time and memory of the decoder scale with the
layer count, the embeddings, heads and VQ are at full size. Weights are random: the images are noise,
the speed and memory are what the shapes cost. Results: a JSON (--json) and one line per run.
"""
from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import torch

from .args import positive_int


@dataclass(frozen=True)
class Spec:
    family: str  # detect_family's name
    checkpoint: str  # the released checkpoint whose configuration this is
    source: str  # where the numbers come from
    dims: dict  # the published dimensions
    layers: int  # layers of the released model
    run_layers: int  # layers run here by default (the real count when it fits the budget)
    load: dict = field(default_factory=dict)  # load_model options
    prompt: str = "a red fox in the snow"


SPECS = {
    "llamagen-xl": Spec(
        "llamagen", "FoundationVision/LlamaGen c2i_XL_384.pt + vq_ds16_c2i.pt",
        "LlamaGen autoregressive/models/gpt.py GPT_XL (n_layer 36, n_head 20, dim 1280, multiple_of 256), "
        "tokenizer/vq_model.py VQ_16 (codebook 16384 x 8, ch 128, ch_mult 1,1,2,2,4, z 256)",
        dict(dim=1280, heads=20, ffn=3584, codes=16384, classes=1000, image=384, vq_ch=128,
             vq_mult=(1, 1, 2, 2, 4), vq_z=256, vq_dim=8, vq_blocks=2), 36, 36, prompt="207"),
    "janus-pro-1b": Spec(
        "janus", "deepseek-community/Janus-Pro-1B",
        "Janus-Pro-1B config.json: language_config hidden 2048, 24 layers, 16 heads, intermediate 5632, vocab "
        "102400; SigLIP-L vision (1024, 24 layers, 384 px, patch 16); gen VQ 16384 x 8, ch 128, mult 1,1,2,2,4",
        dict(hidden=2048, heads=16, kv=16, ffn=5632, vocab=102400, max_pos=16384, v_hidden=1024, v_layers=24,
             v_heads=16, image=384, codes=16384, vq_dim=8, vq_ch=128, vq_mult=(1, 1, 2, 2, 4), vq_z=256),
        24, 12),
    "emu3-gen": Spec(
        "emu3", "BAAI/Emu3-Gen-hf",
        "Emu3-Gen config.json (= transformers Emu3Config defaults): hidden 4096, 32 layers, 32 heads, 8 KV heads, "
        "intermediate 14336, vocab 184622, 9216 positions; VQ 32768 x 4, base 256, mult 1,2,2,4, attn at 3",
        dict(hidden=4096, heads=32, kv=8, ffn=14336, vocab=184622, max_pos=9216, codes=32768, image=720,
             vq_base=256, vq_mult=(1, 2, 2, 4), vq_blocks=2, vq_dim=4), 32, 1),
    "lumina-mgpt-7b": Spec(
        "chameleon", "Alpha-VLLM/Lumina-mGPT-7B-768",
        "Chameleon-7B (= transformers ChameleonConfig defaults): hidden 4096, 32 layers, 32 heads, intermediate "
        "11008, vocab 65536; Chameleon VQGAN 8192 x 256, ch 128, mult 1,1,2,2,4, z 256 (vqgan.yaml). "
        "max_position_embeddings set to 10240 (rotary only, no weights) to hold a 768 px image",
        dict(hidden=4096, heads=32, kv=32, ffn=11008, vocab=65536, max_pos=10240, codes=8192, image=768,
             vq_ch=128, vq_mult=(1, 1, 2, 2, 4), vq_z=256, vq_dim=256, lumina=True), 32, 2),
    "anole-7b": Spec(
        "chameleon", "leloy/Anole-7b-v0.1-hf",
        "Chameleon-7B (= transformers ChameleonConfig defaults): hidden 4096, 32 layers, 32 heads, intermediate "
        "11008, vocab 65536, 4096 positions; Chameleon VQGAN 8192 x 256 (512 px)",
        dict(hidden=4096, heads=32, kv=32, ffn=11008, vocab=65536, max_pos=4096, codes=8192, image=512,
             vq_ch=128, vq_mult=(1, 1, 2, 2, 4), vq_z=256, vq_dim=256, lumina=False), 32, 2),
}

# the CI test's reduced sizes (every width and vocabulary shrunk; same builders, same loaders)
REDUCED = {
    "llamagen-xl": dict(dim=32, heads=4, ffn=128, codes=16, classes=1000, image=64, vq_ch=32, vq_mult=(1, 1, 1, 1, 1),
                        vq_z=32, vq_dim=4, vq_blocks=1),
    "janus-pro-1b": dict(hidden=32, heads=4, kv=2, ffn=64, vocab=64, max_pos=256, v_hidden=16, v_layers=1, v_heads=2,
                         image=32, codes=8, vq_dim=4, vq_ch=32, vq_mult=(1, 1, 1, 1, 1), vq_z=32),
    "emu3-gen": dict(hidden=32, heads=4, kv=2, ffn=64, vocab=128, max_pos=256, codes=8, image=32, vq_base=32,
                     vq_mult=(1, 1, 1, 1), vq_blocks=1, vq_dim=4),
    "lumina-mgpt-7b": dict(hidden=32, heads=4, kv=2, ffn=64, vocab=128, max_pos=256, codes=8, image=64, vq_ch=32,
                           vq_mult=(1, 1, 1, 1, 1), vq_z=32, vq_dim=4, lumina=True),
    "anole-7b": dict(hidden=32, heads=4, kv=2, ffn=64, vocab=128, max_pos=256, codes=8, image=32, vq_ch=32,
                     vq_mult=(1, 1, 1, 1, 1), vq_z=32, vq_dim=4, lumina=False),
}
JANUS_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] | lower == 'user' %}{{ '<|User|>: ' }}"
    "{% for c in message['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{{ '\\n\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|Assistant|>:' }}{% endif %}")
WORDS = ["a", "red", "fox", "in", "the", "snow", "Generate", "an", "image", "of", "according", "to", "following",
         "prompt", ":", "*"] + [str(i) for i in range(10)]


def _word_tokenizer(vocab_size: int, specials: list, **kw):
    """A word-level tokenizer of exactly `vocab_size` entries: the prompt's words, fillers, the specials."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    words = ["<unk>"] + WORDS
    n_fill = vocab_size - len(words) - len(specials)
    if n_fill < 0:
        raise ValueError(f"vocabulary {vocab_size} is smaller than its {len(words) + len(specials)} fixed entries")
    words += [f"w{i}" for i in range(n_fill)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens(specials)
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", **kw)


class _default_dtype:
    def __init__(self, dtype):
        self.dtype = dtype

    def __enter__(self):
        self.old = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc):
        torch.set_default_dtype(self.old)


def _build_llamagen(d, layers, folder, dtype):
    from ..model_loaders.llamagen_vq import LlamaGenVQDecoder
    g = torch.Generator().manual_seed(0)
    r = lambda *s: (torch.randn(*s, generator=g) * (s[-1] ** -0.5 if len(s) > 1 else 1)).to(dtype)  # noqa: E731
    dim, hd = d["dim"], d["dim"] // d["heads"]
    sd = {"tok_embeddings.weight": r(d["codes"], dim) * dim ** 0.5, "norm.weight": torch.ones(dim, dtype=dtype),
          "output.weight": r(d["codes"], dim), "cls_embedding.embedding_table.weight": r(d["classes"] + 1, dim)}
    for i in range(layers):
        p = f"layers.{i}."
        sd.update({p + "attention.wqkv.weight": r(3 * d["heads"] * hd, dim), p + "attention.wo.weight": r(dim, dim),
                   p + "feed_forward.w1.weight": r(d["ffn"], dim), p + "feed_forward.w3.weight": r(d["ffn"], dim),
                   p + "feed_forward.w2.weight": r(dim, d["ffn"]), p + "attention_norm.weight": torch.ones(dim, dtype=dtype),
                   p + "ffn_norm.weight": torch.ones(dim, dtype=dtype)})
    from safetensors.torch import save_file
    save_file(sd, os.path.join(folder, f"c2i_XL_{d['image']}.safetensors"))
    widths = [d["vq_ch"] * m for m in reversed(d["vq_mult"])]
    vq = LlamaGenVQDecoder(d["codes"], d["vq_dim"], d["vq_z"], widths, d["vq_blocks"] + 1)
    save_file({k: v.contiguous() for k, v in vq.state_dict().items()}, os.path.join(folder, "vq_ds16_c2i.safetensors"))
    heads = {} if d["dim"] in (768, 1024, 1280, 1536, 2560, 2048, 3200, 4096) else {"n_head": d["heads"]}
    return heads


def _build_janus(d, layers, folder, dtype):
    from transformers import GenerationConfig, JanusConfig, JanusForConditionalGeneration
    specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<|User|>", "<|Assistant|>",
                "<image_placeholder>", "<begin_of_image>", "<end_of_image>"]
    from tokenizers import processors
    tok = _word_tokenizer(d["vocab"], specials, bos_token=specials[0], eos_token=specials[1], pad_token=specials[2],
                          extra_special_tokens={"image_token": "<image_placeholder>", "boi_token": "<begin_of_image>",
                                                "eoi_token": "<end_of_image>"})
    bos = specials[0]
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tok.convert_tokens_to_ids(bos))])
    tok.chat_template = JANUS_TEMPLATE
    grid = d["image"] // 16
    cfg = JanusConfig(
        text_config=dict(model_type="llama", vocab_size=d["vocab"], hidden_size=d["hidden"],
                         intermediate_size=d["ffn"], num_hidden_layers=layers, num_attention_heads=d["heads"],
                         num_key_value_heads=d["kv"], max_position_embeddings=d["max_pos"],
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id),
        vision_config=dict(hidden_size=d["v_hidden"], num_hidden_layers=d["v_layers"],
                           num_attention_heads=d["v_heads"], image_size=d["image"], patch_size=16,
                           projection_dim=d["hidden"], num_image_tokens=grid * grid),
        vq_config=dict(embed_dim=d["vq_dim"], num_embeddings=d["codes"], latent_channels=d["vq_z"],
                       base_channels=d["vq_ch"], channel_multiplier=list(d["vq_mult"]), num_res_blocks=2,
                       projection_dim=d["hidden"], image_token_embed_dim=d["hidden"], num_patches=grid),
        image_token_id=tok.convert_tokens_to_ids("<image_placeholder>"))
    with _default_dtype(dtype):
        model = JanusForConditionalGeneration(cfg).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        generation_kwargs={"boi_token_id": tok.convert_tokens_to_ids("<begin_of_image>")})
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return {}


def _build_emu3(d, layers, folder, dtype):
    from transformers import Emu3Config, Emu3ForConditionalGeneration, GenerationConfig
    specials = ["<|endoftext|>", "<|extra_203|>", "<|extra_204|>", "<|image start|>", "<|image end|>",
                "<|image token|>", "<|extra_200|>", "<|extra_201|>", "<image>"] + \
        [f"<|visual token{i:06d}|>" for i in range(d["codes"])]
    tok = _word_tokenizer(d["vocab"], specials, bos_token="<|extra_203|>", eos_token="<|extra_204|>",
                          pad_token="<|endoftext|>", extra_special_tokens={
                              "image_token": "<image>", "boi_token": "<|image start|>", "eoi_token": "<|image end|>",
                              "image_wrapper_token": "<|image token|>", "eof_token": "<|extra_201|>"})
    cfg = Emu3Config(
        text_config=dict(vocab_size=d["vocab"], hidden_size=d["hidden"], intermediate_size=d["ffn"],
                         num_hidden_layers=layers, num_attention_heads=d["heads"], num_key_value_heads=d["kv"],
                         max_position_embeddings=d["max_pos"], bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id),
        vq_config=dict(codebook_size=d["codes"], embed_dim=d["vq_dim"], latent_channels=d["vq_dim"],
                       base_channels=d["vq_base"], channel_multiplier=list(d["vq_mult"]),
                       num_res_blocks=d["vq_blocks"], hidden_size=d["vq_base"] * d["vq_mult"][-1],
                       num_attention_heads=1),
        vocabulary_map=tok.get_vocab())
    with _default_dtype(dtype):
        model = Emu3ForConditionalGeneration(cfg).eval()
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id,
                                               eos_token_id=tok.eos_token_id)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    with open(os.path.join(folder, "processor_config.json"), "w") as f:
        json.dump({"image_area": d["image"] * d["image"], "ratio": "1:1"}, f)
    return {}


def _build_chameleon(d, layers, folder, dtype):
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration
    from ..model_loaders.chameleon import code_token_name, lumina_size_token
    from ..model_loaders.chameleon_vqgan import VQGANDecoder
    n = d["image"] // 32
    specials = ["<s>", "</s>", "<pad>", "<image>", "<racm3:break>", "<eoss>", "<reserved08706>", "<reserved08799>"] + \
        ([lumina_size_token(n)] if d["lumina"] else []) + [code_token_name(c) for c in range(d["codes"])]
    tok = _word_tokenizer(d["vocab"], specials, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    arch = "ChameleonXLLMXForConditionalGeneration" if d["lumina"] else "ChameleonForConditionalGeneration"
    vq = dict(embed_dim=d["vq_dim"], n_embed=d["codes"], z_channels=d["vq_z"], ch=d["vq_ch"],
              ch_mult=list(d["vq_mult"]), num_res_blocks=2, resolution=d["image"], attn_resolutions=[])
    cfg = ChameleonConfig(
        vocab_size=d["vocab"], hidden_size=d["hidden"], intermediate_size=d["ffn"], num_hidden_layers=layers,
        num_attention_heads=d["heads"], num_key_value_heads=d["kv"], max_position_embeddings=d["max_pos"],
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        vocabulary_map=tok.get_vocab(), architectures=[arch],
        vq_config=dict(embed_dim=d["vq_dim"], num_embeddings=d["codes"], latent_channels=d["vq_z"],
                       resolution=d["image"], base_channels=d["vq_ch"], channel_multiplier=list(d["vq_mult"]),
                       num_res_blocks=2, attn_resolutions=[]))
    with _default_dtype(dtype):
        model = ChameleonForConditionalGeneration(cfg).eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    del model
    cfg_path = os.path.join(folder, "config.json")  # save_pretrained writes its own class; Lumina-mGPT names its own
    with open(cfg_path) as f:
        saved = json.load(f)
    saved["architectures"] = [arch]
    with open(cfg_path, "w") as f:
        json.dump(saved, f, indent=1)
    dec = VQGANDecoder(**vq)
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in dec.state_dict().items()}, os.path.join(folder, "vqgan.safetensors"))
    with open(os.path.join(folder, "vqgan.yaml"), "w") as f:
        f.write("model:\n  target: chameleon.vqgan.VQModel\n  params:\n"
                f"    embed_dim: {vq['embed_dim']}\n    n_embed: {vq['n_embed']}\n    ddconfig:\n"
                f"      double_z: false\n      z_channels: {vq['z_channels']}\n      resolution: {vq['resolution']}\n"
                f"      in_channels: 3\n      out_ch: 3\n      ch: {vq['ch']}\n      ch_mult: {vq['ch_mult']}\n"
                f"      num_res_blocks: 2\n      attn_resolutions: []\n      dropout: 0.0\n")
    return {"target_size": d["image"]} if d["lumina"] else {}


BUILDERS = {"llamagen": _build_llamagen, "janus": _build_janus, "emu3": _build_emu3, "chameleon": _build_chameleon}


def build_folder(name: str, out: str, layers=None, reduced: bool = False, dtype=torch.bfloat16) -> str:
    """Write `name`'s random-weight model in its family's folder format under `out`; returns the folder.
    `reduced`: the CI test's small widths (REDUCED); the load options go to <folder>/real_size.json."""
    spec = SPECS[name]
    dims = {**spec.dims, **REDUCED[name]} if reduced else spec.dims
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    extra = BUILDERS[spec.family](dims, layers or spec.run_layers, folder, dtype)
    with open(os.path.join(folder, "real_size.json"), "w") as f:
        json.dump({"load": {**spec.load, **extra}, "image": dims["image"]}, f)
    return folder


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes


def module_bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))


def decoder_layers(model):
    """The decoder's layer list of a loaded model (for the per-layer memory)."""
    tm = model.torch_module()
    for path in ("layers", "model.language_model.layers", "model.text_model.layers", "model.layers"):
        obj = tm
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
            return obj
        except AttributeError:
            continue
    raise ValueError(f"no decoder layers found in {type(tm).__name__}")


def measure(folder: str, dtype: str, quantize: str, steps: int, backend: str, repeats: int, decode: bool = True) -> dict:
    """Load `folder`, generate a few steps, decode a full grid, time 1- and 17-token forwards."""
    from .. import load_model
    from ..samplers.api import generate
    from ..samplers.engine import GenerationInterrupted
    with open(os.path.join(folder, "real_size.json")) as f:
        meta = json.load(f)
    rss0 = _peak_rss_bytes()
    t0 = time.perf_counter()
    model = load_model(folder, device="cpu", dtype=dtype, quantize=quantize, **meta["load"])
    load_s = time.perf_counter() - t0
    geo = model.geometry
    done = {"steps": 0}

    def progress(*_):
        done["steps"] += 1

    t0 = time.perf_counter()
    try:
        res = generate(model, SPECS_BY_FOLDER(folder).prompt, backend=backend, seed=0, window=16, progress=progress,
                       interrupt=lambda: done["steps"] >= steps)
        tokens_done = int(res.tokens.numel())
    except GenerationInterrupted:
        tokens_done = None
    gen_s = time.perf_counter() - t0
    prompt = model.encode_prompt(SPECS_BY_FOLDER(folder).prompt)
    times = {}
    with torch.inference_mode():
        for T in (1, 17):
            session = model.start(prompt, 1, True, draft_capacity=17)
            tokens = torch.randint(geo.vocab_size, (1, T))
            parents = [-1] + list(range(T - 1))
            model.forward(session, tokens, parents)  # warm-up
            ms = []
            for _ in range(repeats):
                t = time.perf_counter()
                model.forward(session, tokens, parents)
                ms.append((time.perf_counter() - t) * 1000)
            times[T] = statistics.median(ms)
    rss_before_decode = _peak_rss_bytes()  # the VQ decoder's activations at full size come next
    codes = torch.randint(geo.vocab_size, (1, geo.height, geo.width))
    t0 = time.perf_counter()
    image = model.decode_tokens(codes)[0] if decode else None
    decode_s = time.perf_counter() - t0
    layers = decoder_layers(model)
    params = sum(p.numel() for p in model.torch_module().parameters())
    return dict(load_s=round(load_s, 2), generate_steps=done["steps"], generate_s=round(gen_s, 2),
                finished_tokens=tokens_done, decode_s=round(decode_s, 2) if decode else None,
                image_size=list(image.size) if decode else None,
                grid=[geo.height, geo.width], ms_forward_1=round(times[1], 1), ms_forward_17=round(times[17], 1),
                layers_run=len(layers), layer_bytes=module_bytes(layers[0]), model_bytes=module_bytes(model.torch_module()),
                params_stored=params, peak_rss_bytes=_peak_rss_bytes(), peak_rss_before_decode_bytes=rss_before_decode,
                rss_before_load_bytes=rss0)


def SPECS_BY_FOLDER(folder: str) -> Spec:  # noqa: N802 -- a lookup, named like the table it reads
    return SPECS[os.path.basename(os.path.normpath(folder))]


def real_params(spec: Spec, layers: int) -> int:
    """Parameters of the decoder at `layers` layers plus embeddings and head (the MODELS.md formula)."""
    d = spec.dims
    if spec.family == "llamagen":
        w, f, v = d["dim"], d["ffn"], d["codes"]
        per = 4 * w * w + 3 * w * f
        return layers * per + 2 * v * w
    w, f, v = d["hidden"], d["ffn"], d["vocab"]
    kv = w * d["kv"] // d["heads"]
    per = 2 * w * w + 2 * w * kv + 3 * w * f
    return layers * per + 2 * v * w


def add_arguments(ap) -> None:
    ap.add_argument("--families", nargs="+", default=list(SPECS), choices=list(SPECS), help="which models")
    ap.add_argument("--precisions", nargs="+", default=["bf16", "int8", "int4"], choices=["bf16", "int8", "int4"],
                    help="bf16 weights, or bf16 with int8 / int4 weight-only quantization")
    ap.add_argument("--layers", type=positive_int, default=None, help="decoder layers for every family (default: "
                    "each family's budget in SPECS: the real count where it fits, else fewer)")
    ap.add_argument("--steps", type=positive_int, default=2, help="speculative steps of generate per run")
    ap.add_argument("--backend", default="sjd", help="the speculative backend generate runs (window 16)")
    ap.add_argument("--repeats", type=positive_int, default=3, help="timed forwards per size (median)")
    ap.add_argument("--threads", type=positive_int, default=2, help="torch threads in each run")
    ap.add_argument("--workdir", default=None, help="where the model folders are written (default: a temp folder)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--reduced", action="store_true", help="the CI test's tiny widths (checks the path, not the size)")
    ap.add_argument("--no-decode", action="store_true", help="skip the VQ decode (its full-size activations "
                    "dominate the peak memory of the large decoders)")
    ap.add_argument("--reuse", action="store_true", help="use a model folder already built in --workdir (same "
                    "--layers) instead of writing it again")
    ap.add_argument("--table", nargs="+", default=None, metavar="JSON", help="print the docs table of results JSONs "
                    "and exit")
    ap.add_argument("--child", nargs=3, metavar=("FOLDER", "QUANTIZE", "STEPS"), help=argparse_hidden())


def argparse_hidden():
    import argparse
    return argparse.SUPPRESS


def table(paths) -> str:
    """The docs/MODELS.md table of results JSONs, with each run's int4 / int8 bytes per decoder layer as a
    share of its bf16 layer (same run)."""
    results = []
    for path in paths:
        with open(path) as f:
            results += json.load(f)["results"]
    data = {"results": results}
    rows = ["| model (checkpoint shape) | layers run / real | params as run / real | precision | decoder layer "
            "| weights held | peak RSS | ms / forward, 1 token | ms / forward, 17 tokens | image |", "|" + "---|" * 10]
    bf16 = {r["model"]: r["layer_bytes"] for r in data["results"] if r["precision"] == "bf16"}
    for r in data["results"]:
        share = f" ({r['layer_bytes'] / bf16[r['model']]:.0%} of bf16)" if r["precision"] != "bf16" and \
            r["model"] in bf16 else ""
        p_run = f"{r['params_as_run'] / 1e9:.2f} B" if r.get("params_as_run") else "-"
        rows.append(f"| {r['model']} ({r['checkpoint'].split(' ')[0]}) | {r['layers_run']} / {r['layers_real']} | "
                    f"{p_run} / {r['params_real'] / 1e9:.2f} B | {r['precision']} | "
                    f"{r['layer_bytes'] / 2 ** 20:.1f} MiB{share} | {r['model_bytes'] / 2 ** 30:.2f} GiB | "
                    f"{r['peak_rss_bytes'] / 2 ** 30:.2f} GiB | "
                    f"{r['ms_forward_1']:.0f} | {r['ms_forward_17']:.0f} | "
                    + (f"{r['image_size'][0]}x{r['image_size'][1]} |" if r["image_size"] else "not decoded |"))
    return "\n".join(rows)


def run(args) -> None:
    if args.table:
        print(table(args.table))
        return
    torch.set_num_threads(args.threads)
    if args.child:
        folder, quantize, steps = args.child
        print(json.dumps(measure(folder, "bf16" if not args.reduced else "fp32", quantize, int(steps), args.backend,
                                 args.repeats, decode=not args.no_decode)))
        return
    work = args.workdir or tempfile.mkdtemp(prefix="specar-real-size-")
    results = []
    for name in args.families:
        spec = SPECS[name]
        layers = args.layers or spec.run_layers
        t0 = time.perf_counter()
        folder = os.path.join(work, name)
        if not (args.reuse and os.path.isfile(os.path.join(folder, "real_size.json"))):
            folder = build_folder(name, work, layers=layers, reduced=args.reduced,
                                  dtype=torch.float32 if args.reduced else torch.bfloat16)
        build_s = time.perf_counter() - t0
        for prec in args.precisions:
            quantize = "none" if prec == "bf16" else prec
            cmd = [sys.executable, "-m", "specar", "real-size", "--child", folder, quantize, str(args.steps),
                   "--backend", args.backend, "--repeats", str(args.repeats), "--threads", str(args.threads)]
            cmd += ["--reduced"] if args.reduced else []
            cmd += ["--no-decode"] if args.no_decode else []
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                raise RuntimeError(f"{name} {prec}: {out.stderr.strip().splitlines()[-1] if out.stderr else out.returncode}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row.update(model=name, checkpoint=spec.checkpoint, source=spec.source, precision=prec,
                       layers_real=spec.layers, params_as_run=real_params(spec, layers) if not args.reduced else None,
                       params_real=real_params(spec, spec.layers), build_s=round(build_s, 1))
            results.append(row)
            _write_json(args, results)  # after every run: a long run stopped early keeps what it measured
            print(f"{name:15s} {prec:5s} layers {row['layers_run']}/{spec.layers} image {row['image_size']} "
                  f"peak {row['peak_rss_bytes'] / 2 ** 30:.2f} GiB  layer {row['layer_bytes'] / 2 ** 20:.1f} MiB  "
                  f"fwd1 {row['ms_forward_1']:.0f} ms  fwd17 {row['ms_forward_17']:.0f} ms  "
                  f"steps {row['generate_steps']} ({row['generate_s']:.1f} s)  decode {row['decode_s']} s", flush=True)
        if not args.workdir:
            import shutil
            shutil.rmtree(folder, ignore_errors=True)


def _write_json(args, results) -> None:
    if args.json:
        meta = dict(command="python -m specar " + " ".join(sys.argv[1:]), torch=torch.__version__,
                    machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                    date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), threads=args.threads, results=results)
        with open(args.json, "w") as f:
            json.dump(meta, f, indent=1)


__all__ = ["BUILDERS", "REDUCED", "SPECS", "build_folder", "measure", "real_params"]
