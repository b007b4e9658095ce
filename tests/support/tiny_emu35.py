"""A tiny random-weight Emu3.5-Image folder in the released layout, for the tests and the ComfyUI checks. Not a test.

Plain torch + safetensors + PyYAML, no pytest and no specar, so ComfyUI's own Python runs it too:

    python tests/support/tiny_emu35.py MODELS_SPECAR_DIR [NAME]

makes MODELS_SPECAR_DIR/NAME (default Emu3.5-Image, the released folder's name, so the example workflow finds it)
with the release's files (BAAI/Emu3.5-Image): config.json with the keys of the reference's ``Emu3Config``
(model_type "Emu3", explicit head_dim), ``model-0000N-of-00002.safetensors`` + ``model.safetensors.index.json`` under
the reference's tensor names (per-head ``q_norm`` / ``k_norm``), ``emu3.tiktoken`` (base64 token and rank per line: the
256 bytes and merges learnt from the prompt template here), ``emu3_vision_tokens.txt``, ``generation_config.json``,
``tokenizer_config.json``; and in NAME/vision_tokenizer the VisionTokenizer's layout (BAAI/Emu3.5-VisionTokenizer):
``config.yaml`` (IBQ's constructor arguments: ddconfig, n_embed, embed_dim) and ``model.ckpt`` (a ``state_dict`` of
tensors, encoder included) with 16x down-sampling at tiny widths.
"""
import base64
import json
import os
import re
import sys

import torch

DIM, HEADS, KV, HEAD_DIM, LAYERS, FFN, CODES = 32, 4, 2, 16, 2, 64, 4  # head_dim != DIM / HEADS, as the 34B model
TRAIN_TEXT = ("You are a helpful assistant for t2i task. USER: a red cat on the grass ASSISTANT: "
              "You are a helpful assistant. USER:  ASSISTANT: 2*2 64*64 blue dog")
VQ = dict(embed_dim=8, n_embed=CODES, ddconfig=dict(double_z=False, z_channels=8, resolution=32, in_channels=3,
                                                     out_ch=3, ch=32, ch_mult=[1, 1, 1, 1, 1], num_res_blocks=1,
                                                     attn_resolutions=[2], dropout=0.0))


def bpe_ranks(text: str, merges: int = 60) -> dict:
    """bytes -> rank: the 256 single bytes, then `merges` pair merges learnt greedily on `text`'s words."""
    ranks = {bytes([b]): b for b in range(256)}
    pieces = (m.encode() for m in re.findall(r" ?\w+| ?[^\w\s]+|\s+", text))
    words = [[w[i:i + 1] for i in range(len(w))] for w in pieces]
    for _ in range(merges):
        counts = {}
        for w in words:
            for a, b in zip(w, w[1:]):
                counts[a + b] = counts.get(a + b, 0) + 1
        best = max(counts, key=lambda k: (counts[k], k), default=None)
        if best is None:
            break
        ranks[best] = len(ranks)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] + w[i + 1] == best:
                    w[i:i + 2] = [best]
                i += 1
    return ranks


def special_ids(n_ranks: int) -> dict:
    """The reference's special-token numbering after the BPE ranks (its Emu3Tokenizer; from 151643 in the release)."""
    names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|extra_{i}|>" for i in range(205)] + \
        ["<|image token|>", "<|image start|>", "<|image end|>"] + [f"<|visual token {i:06d}|>" for i in range(CODES)]
    return {t: n_ranks + i for i, t in enumerate(names)}


def decoder_state(vocab: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    sd = {"model.embed_tokens.weight": torch.randn(vocab, DIM, generator=g),
          "model.norm.weight": 1 + 0.1 * torch.randn(DIM, generator=g),
          "lm_head.weight": torch.randn(vocab, DIM, generator=g) * DIM ** -0.5}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for name, shape in (("self_attn.q_proj", (HEADS * HEAD_DIM, DIM)), ("self_attn.k_proj", (KV * HEAD_DIM, DIM)),
                            ("self_attn.v_proj", (KV * HEAD_DIM, DIM)), ("self_attn.o_proj", (DIM, HEADS * HEAD_DIM)),
                            ("mlp.gate_proj", (FFN, DIM)), ("mlp.up_proj", (FFN, DIM)), ("mlp.down_proj", (DIM, FFN))):
            sd[p + name + ".weight"] = torch.randn(shape, generator=g) * shape[1] ** -0.5
        for name, n in (("self_attn.q_norm", HEAD_DIM), ("self_attn.k_norm", HEAD_DIM), ("input_layernorm", DIM),
                        ("post_attention_layernorm", DIM)):
            sd[p + name + ".weight"] = 1 + 0.2 * torch.randn(n, generator=g)
    return sd


def vq_state(seed: int = 1) -> dict:
    """IBQ's state dict at VQ's widths (decoder, encoder stub, quantizer), random."""
    g = torch.Generator().manual_seed(seed)
    dd, c = VQ["ddconfig"], VQ["ddconfig"]["ch"]
    sd = {"quantize.embedding.weight": torch.randn(CODES, VQ["embed_dim"], generator=g),
          "post_quant_conv.weight": torch.randn(dd["z_channels"], VQ["embed_dim"], 1, 1, generator=g) * 0.3,
          "post_quant_conv.bias": torch.zeros(dd["z_channels"]),
          "quant_conv.weight": torch.randn(VQ["embed_dim"], dd["z_channels"], 1, 1, generator=g),
          "encoder.conv_in.weight": torch.randn(c, 3, 3, 3, generator=g)}

    def conv(name, cin, cout, k):
        sd[name + ".weight"] = torch.randn(cout, cin, k, k, generator=g) * (cin * k * k) ** -0.5
        sd[name + ".bias"] = 0.1 * torch.randn(cout, generator=g)

    def norm(name):
        sd[name + ".weight"] = 1 + 0.1 * torch.randn(c, generator=g)
        sd[name + ".bias"] = 0.1 * torch.randn(c, generator=g)

    def res(name):
        norm(name + ".norm1"), conv(name + ".conv1", c, c, 3), norm(name + ".norm2"), conv(name + ".conv2", c, c, 3)

    def attn(name):
        norm(name + ".norm")
        for p in ("q", "k", "v", "proj_out"):
            conv(f"{name}.{p}", c, c, 1)

    levels = len(dd["ch_mult"])
    conv("decoder.conv_in", dd["z_channels"], c, 3)
    res("decoder.mid.block_1"), attn("decoder.mid.attn_1"), res("decoder.mid.block_2")
    for lvl in range(levels):
        for b in range(dd["num_res_blocks"] + 1):
            res(f"decoder.up.{lvl}.block.{b}")
            if lvl == levels - 1:  # the lowest resolution (2 px here) is the one in attn_resolutions
                attn(f"decoder.up.{lvl}.attn.{b}")
        if lvl:
            conv(f"decoder.up.{lvl}.upsample.conv", c, c, 3)
    norm("decoder.norm_out"), conv("decoder.conv_out", c, 3, 3)
    return sd


def config(ids: dict, vocab: int, **over) -> dict:
    """config.json as the reference's Emu3Config saves it (configuration_emu3.py's keys)."""
    cfg = dict(architectures=["Emu3ForCausalLM"], attention_dropout=0.1,
               auto_map={"AutoConfig": "configuration_emu3.Emu3Config",
                         "AutoModelForCausalLM": "modeling_emu3.Emu3ForCausalLM"},
               boi_token_id=ids["<|image start|>"], bos_token_id=ids["<|extra_203|>"],
               eof_token_id=ids["<|extra_201|>"],
               eoi_token_id=ids["<|image end|>"], eol_token_id=ids["<|extra_200|>"], eos_token_id=ids["<|extra_204|>"],
               head_dim=HEAD_DIM, hidden_act="silu", hidden_size=DIM, image_area=1048576,
               img_token_id=ids["<|image token|>"], initializer_range=0.02, intermediate_size=FFN,
               max_position_embeddings=32768, model_type="Emu3", num_attention_heads=HEADS, num_hidden_layers=LAYERS,
               num_key_value_heads=KV, pad_token_id=ids["<|endoftext|>"], pretraining_tp=1, rms_norm_eps=1e-5,
               rope_scaling=None, rope_theta=1000000.0, tie_word_embeddings=False, torch_dtype="bfloat16",
               transformers_version="4.48.2", use_cache=True, vocab_size=vocab)
    cfg.update(over)
    return cfg


def build(folder: str, seed: int = 0, vision: bool = True) -> dict:
    """The tiny Emu3.5-Image folder (and its vision_tokenizer subfolder); returns the decoder's state dict."""
    import yaml
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    ranks = bpe_ranks(TRAIN_TEXT)
    ids = special_ids(len(ranks))
    vocab = max(ids.values()) + 1
    with open(os.path.join(folder, "emu3.tiktoken"), "wb") as f:
        f.writelines(base64.b64encode(t) + b" " + str(r).encode() + b"\n" for t, r in ranks.items())
    with open(os.path.join(folder, "emu3_vision_tokens.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(t for t in ids if not t.startswith(("<|extra_", "<|endoftext", "<|im_"))) + "\n")
    files = {"config.json": config(ids, vocab),
             "generation_config.json": {"bos_token_id": ids["<|extra_203|>"], "eos_token_id": ids["<|extra_204|>"],
                                        "pad_token_id": ids["<|endoftext|>"], "transformers_version": "4.48.2"},
             "tokenizer_config.json": {"model_max_length": 10 ** 18, "tokenizer_class": "Emu3Tokenizer",
                                       "auto_map": {"AutoTokenizer": ["tokenization_emu3.Emu3Tokenizer", None]}}}
    for name, obj in files.items():
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2)
    sd = decoder_state(vocab, seed)
    keys = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for name, ks in shards.items():
        save_file({k: sd[k].to(torch.bfloat16).contiguous() for k in ks}, os.path.join(folder, name))
    with open(os.path.join(folder, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        json.dump({"metadata": {}, "weight_map": {k: n for n, ks in shards.items() for k in ks}}, f, indent=2)
    if vision:
        vq = os.path.join(folder, "vision_tokenizer")
        os.makedirs(vq, exist_ok=True)
        with open(os.path.join(vq, "config.yaml"), "w", encoding="utf-8") as f:
            yaml.safe_dump(VQ, f)
        torch.save({"state_dict": vq_state(seed + 1)}, os.path.join(vq, "model.ckpt"))
    return {k: v.to(torch.bfloat16).float() for k, v in sd.items()}


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    out = os.path.join(sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else "Emu3.5-Image")
    build(out)
    print(out)
