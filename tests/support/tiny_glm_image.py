"""A tiny random-weight GLM-Image folder in the released layout, for the tests and the ComfyUI checks. Not a test.

Plain torch + transformers (>= 5: the GlmImage classes) + tokenizers, no pytest and no specar, so ComfyUI's own
Python runs it too:

    python tests/support/tiny_glm_image.py MODELS_SPECAR_DIR [NAME]

makes MODELS_SPECAR_DIR/NAME (default GLM-Image, the released folder's name, so the example workflow finds it):
the AR stage and its processor (`build_tiny_glm_image`, tests/test_glm_image.py's), a model_index.json (the
released layout; no DiT files: the node shows the codes in their preview colours) and a generation config with
sampling values of its own (COMFYUI_SAMPLING), which the sampler node's stats must show at "model default".
"""
import json
import os
import sys

import torch

CODES = 8
# the tiny ComfyUI folder's recommended sampling (generation_config.json), unlike the released 0.9 / 0.75 and the
# node's old widget defaults (1.0 / 1.0), so a stat read from anywhere else shows
COMFYUI_SAMPLING = {"temperature": 0.85, "top_p": 0.7, "top_k": 6}


def build_tiny_glm_image(root, seed=0, hidden=32):
    """The AR stage and its processor in the released layout under `root`; returns (model, processor)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (GenerationConfig, GlmImageConfig, GlmImageForConditionalGeneration,
                              GlmImageImageProcessorPil, GlmImageProcessor, PreTrainedTokenizerFast)

    vision = [f"<|dit_token_{i}|>" for i in range(CODES + 2)]  # the codes, then image start (BOS), image end (EOS)
    words = ["<unk>", "a", "red", "blue", "cat", "dog", "on", "the", "grass", "sky", "sign", "no"] + \
        [str(d) for d in range(65)]
    specials = ["<|endoftext|>", "[gMASK]", "<sop>", "<eop>", "<|user|>", "<|assistant|>", "<|image|>"]
    tk = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vision + words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens(vision + specials)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token=vision[CODES], eos_token=vision[CODES + 1], pad_token="<|endoftext|>",
        unk_token="<unk>",
        extra_special_tokens={"image_token": "<|image|>", "grid_bos_token": "<sop>", "grid_eos_token": "<eop>"})
    template = ("[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>{% for c in m['content'] %}"
                "{% if c['type'] == 'image' %}" + vision[CODES] + "<|image|>" + vision[CODES + 1] + "{% endif %}"
                "{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endfor %}<|assistant|>")
    # references (image-to-image): 16-pixel patches, one code each (the vision encoder's patch, no merging)
    pixels = GlmImageImageProcessorPil(patch_size=16, temporal_patch_size=1, merge_size=1,
                                       size={"shortest_edge": 32 * 32, "longest_edge": 256 * 256})
    proc = GlmImageProcessor(image_processor=pixels, tokenizer=tok, chat_template=template)
    cfg = GlmImageConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, vision_vocab_size=CODES + 2,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                         pad_token_id=tok.pad_token_id, eos_token_id=CODES + 1),
        vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, image_size=64, patch_size=16),
        vq_config=dict(embed_dim=8, num_embeddings=CODES, latent_channels=32),
        image_token_id=tok.convert_tokens_to_ids("<|image|>"), image_start_token_id=CODES,
        image_end_token_id=CODES + 1)
    torch.manual_seed(seed)
    model = GlmImageForConditionalGeneration(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and ("language_model" in name or name.startswith("lm_head")):
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "embed" in name else p.shape[-1] ** -0.5))
        model.lm_head.weight.mul_(3.0)
    model.generation_config = GenerationConfig(
        do_sample=True, temperature=0.9, top_p=0.75, top_k=CODES, bos_token_id=CODES, eos_token_id=CODES + 1,
        pad_token_id=tok.pad_token_id)
    model.save_pretrained(os.path.join(root, "vision_language_encoder"))
    proc.save_pretrained(os.path.join(root, "processor"))
    return model, proc


def comfyui_folder(specar_dir: str, name: str = "GLM-Image") -> str:
    """The tiny folder as ComfyUI's models/specar/<name> (see the module's help); returns its path."""
    folder = os.path.join(specar_dir, name)
    build_tiny_glm_image(folder)
    with open(os.path.join(folder, "model_index.json"), "w") as f:
        json.dump({"_class_name": "GlmImagePipeline"}, f)
    path = os.path.join(folder, "vision_language_encoder", "generation_config.json")
    with open(path) as f:
        gen = json.load(f)
    gen.update(COMFYUI_SAMPLING)
    with open(path, "w") as f:
        json.dump(gen, f, indent=2)
    return folder


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python tests/support/tiny_glm_image.py MODELS_SPECAR_DIR [NAME]")
    print(comfyui_folder(*sys.argv[1:]))
