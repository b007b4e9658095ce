"""real-size's model folders: a random-weight model of each family at the published configuration of a released
checkpoint (`SPECS`, with their source), written in the family's real folder format (transformers
`save_pretrained` + tokenizer files, Chameleon's `vqgan.yaml` / VQGAN weights, LlamaGen's checkpoint and VQ
files), for `load_model` to load through the code path of a real folder; `REDUCED`: the CI test's small widths."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch


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
    "glm-image": Spec(
        "glm_image", "zai-org/GLM-Image (vision_language_encoder, processor)",
        "transformers GlmImageConfig defaults (documented as zai-org/GLM-Image's; docs/MODELS.md): text hidden 4096, "
        "40 layers, 32 heads, 2 KV heads, intermediate 13696, vocab 168064, 16384 codes (VQ embed 2048, latent "
        "1536), LM head of 16512 rows (vision_vocab_size); vision encoder 1536 wide, 40 layers, 16 heads, "
        "intermediate 6144; 1024x1024 px: 16x16 preview grid + 32x32 target grid (1,280 positions), no row ends, "
        "no CFG in the AR stage",
        dict(hidden=4096, heads=32, kv=2, ffn=13696, vocab=168064, codes=16384, image=1024, v_hidden=1536,
             v_layers=40, v_heads=16, v_ffn=6144, vq_dim=2048, vq_latent=1536, head=16512), 40, 2,
        prompt="a red fox in the snow"),
}

# GLM-Image's tiny widths (gpu-check's dry run keeps the released vocabulary and grids; real-size's CI case shrinks
# those too): head width 16, M-RoPE sections 2 + 3 + 3 over its rotary half
GLM_TINY = dict(hidden=64, heads=4, kv=2, ffn=128, v_hidden=32, v_layers=1, v_heads=2, v_ffn=64, vq_dim=8,
                vq_latent=32)
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
    "glm-image": dict(GLM_TINY, vocab=256, codes=8, image=64, head=10),
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


def _save_hf(cls, cfg, generation_config, tok, folder, dtype, weights: bool) -> None:
    """A transformers folder: config, generation config, tokenizer and (`weights`) the random-weight model of `cls`;
    without weights, what a loader reads besides them (gpu-check builds the weights in memory on the device)."""
    if weights:
        with _default_dtype(dtype):
            model = cls(cfg).eval()
        model.generation_config = generation_config
        model.save_pretrained(folder)
    else:
        cfg.save_pretrained(folder)
        generation_config.save_pretrained(folder)
    tok.save_pretrained(folder)


def _build_llamagen(d, layers, folder, dtype):
    from ..model_loaders.families.llamagen_vq import LlamaGenVQDecoder
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


def _build_janus(d, layers, folder, dtype, weights=True):
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
    gen = GenerationConfig(bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id,
                           generation_kwargs={"boi_token_id": tok.convert_tokens_to_ids("<begin_of_image>")})
    _save_hf(JanusForConditionalGeneration, cfg, gen, tok, folder, dtype, weights)
    return {}


def _build_emu3(d, layers, folder, dtype, weights=True):
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
    gen = GenerationConfig(bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    _save_hf(Emu3ForConditionalGeneration, cfg, gen, tok, folder, dtype, weights)
    with open(os.path.join(folder, "processor_config.json"), "w") as f:
        json.dump({"image_area": d["image"] * d["image"], "ratio": "1:1"}, f)
    return {}


def _build_chameleon(d, layers, folder, dtype):
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration
    from ..model_loaders.families.chameleon import code_token_name, lumina_size_token
    from ..model_loaders.families.chameleon_vqgan import VQGANDecoder
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


def _build_glm_image(d, layers, folder, dtype, weights=True):
    """GLM-Image's AR stage (transformers' GlmImage classes) with its processor beside it (an AR folder alone: no
    DiT, the tokens are what is measured): codes at ids 0..V-1, image start / end at V, V+1, as released."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (GenerationConfig, GlmImageConfig, GlmImageForConditionalGeneration,
                              GlmImageImageProcessorPil, GlmImageProcessor, PreTrainedTokenizerFast)
    V = d["codes"]
    vision = [f"<|dit_token_{i}|>" for i in range(V + 2)]
    specials = ["<|endoftext|>", "[gMASK]", "<sop>", "<eop>", "<|user|>", "<|assistant|>", "<|image|>"]
    tk = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vision + ["<unk>"] + WORDS)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens(vision[V:] + specials)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token=vision[V], eos_token=vision[V + 1], pad_token="<|endoftext|>", unk_token="<unk>",
        extra_special_tokens={"image_token": "<|image|>", "grid_bos_token": "<sop>", "grid_eos_token": "<eop>"})
    template = ("[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>{% for c in m['content'] %}"
                "{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endfor %}<|assistant|>")
    proc = GlmImageProcessor(image_processor=GlmImageImageProcessorPil(patch_size=16), tokenizer=tok,
                             chat_template=template)
    head = d["hidden"] // d["heads"]
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if head != 128:  # the released width takes transformers' default sections ([8, 12, 12]); a tiny one 2 + 3 + 3
        rope["mrope_section"] = [head // 8, 3 * head // 16, 3 * head // 16]
    cfg = GlmImageConfig(
        text_config=dict(vocab_size=d["vocab"], hidden_size=d["hidden"], intermediate_size=d["ffn"],
                         num_hidden_layers=layers, num_attention_heads=d["heads"], num_key_value_heads=d["kv"],
                         vision_vocab_size=d["head"],  # the LM head's rows: the codes, image start / end, spare
                         rope_parameters=rope,
                         pad_token_id=tok.pad_token_id, eos_token_id=V + 1),
        vision_config=dict(depth=d["v_layers"], hidden_size=d["v_hidden"], num_heads=d["v_heads"],
                           intermediate_size=d["v_ffn"], patch_size=16),
        vq_config=dict(embed_dim=d["vq_dim"], num_embeddings=V, latent_channels=d["vq_latent"]),
        image_token_id=tok.convert_tokens_to_ids("<|image|>"), image_start_token_id=V, image_end_token_id=V + 1)
    # the released generation_config.json's sampling as issue 54 quotes it (temperature 0.9, top-p 0.75)
    gen = GenerationConfig(do_sample=True, temperature=0.9, top_p=0.75, bos_token_id=V, eos_token_id=V + 1,
                           pad_token_id=tok.pad_token_id)
    _save_hf(GlmImageForConditionalGeneration, cfg, gen, tok, folder, dtype, weights)
    proc.save_pretrained(folder)
    return {"width": d["image"], "height": d["image"]}


BUILDERS = {"llamagen": _build_llamagen, "janus": _build_janus, "emu3": _build_emu3, "chameleon": _build_chameleon,
            "glm_image": _build_glm_image}


def build_folder(name: str, out: str, layers=None, reduced: bool = False, dtype=torch.bfloat16, spec=None,
                 dims=None, weights: bool = True) -> str:
    """Write `name`'s random-weight model in its family's folder format under `out`; returns the folder.
    `reduced`: the CI test's small widths (REDUCED); the load options go to <folder>/real_size.json. `spec` / `dims`:
    a checkpoint not in SPECS (tooling/released_models.py); `weights=False` (Janus, Emu3): no weights written."""
    spec = spec or SPECS[name]
    dims = dims or ({**spec.dims, **REDUCED[name]} if reduced else spec.dims)
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    extra = BUILDERS[spec.family](dims, layers or spec.run_layers, folder, dtype, **({} if weights else
                                                                                    {"weights": False}))
    with open(os.path.join(folder, "real_size.json"), "w") as f:
        json.dump({"load": {**spec.load, **extra}, "image": dims["image"]}, f)
    return folder


__all__ = ["BUILDERS", "REDUCED", "SPECS", "Spec", "build_folder"]
