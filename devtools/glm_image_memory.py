"""GLM-Image's weight memory, computed (not measured) from the released shapes on the meta device: the AR stage
(transformers' GlmImageConfig defaults, which transformers documents as zai-org/GLM-Image's) in bf16 and after
SpecAR's int8 / int4 weight-only quantization (the same `quantize_module` the loader runs), and the DiT decoder's
parts (diffusers' classes at the shapes SGLang's GlmImageArchConfig gives the released DiT: 30 layers, 32 heads of
128; the glyph encoder at ByT5-small's shape, which its text_embed_dim 1472 matches; a 16-channel VAE), which
SpecAR loads in the model's dtype, unquantized. Needs transformers 5 and diffusers (the glm-image extra).

    python devtools/glm_image_memory.py      # prints the table docs/NODES.md's GLM-Image section shows
"""
import torch
from diffusers import AutoencoderKL, GlmImageTransformer2DModel
from transformers import GlmImageConfig, GlmImageForConditionalGeneration, T5Config, T5EncoderModel

from specar.model_loaders.precision.quantize import quantize_module

GB = 1e9


def nbytes(module, dtype_bytes=2):
    """Bytes of a module's parameters and buffers: floating ones at `dtype_bytes` (bf16), integer ones as stored."""
    return sum(t.numel() * (dtype_bytes if t.is_floating_point() else t.element_size())
               for t in list(module.parameters()) + list(module.buffers()))


def ar_stage(quantize):
    with torch.device("meta"):
        model = GlmImageForConditionalGeneration(GlmImageConfig()).to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    if quantize != "none":
        quantize_module(model, quantize)
    return params, nbytes(model)


def dit_parts():
    with torch.device("meta"):
        parts = {
            "DiT": GlmImageTransformer2DModel(attention_head_dim=128, num_attention_heads=32),
            "glyph encoder": T5EncoderModel(T5Config(vocab_size=384, d_model=1472, d_kv=64, d_ff=3584, num_layers=12,
                                                     num_heads=6, feed_forward_proj="gated-gelu")),
            "VAE": AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16,
                                 block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                                 down_block_types=("DownEncoderBlock2D",) * 4,
                                 up_block_types=("UpDecoderBlock2D",) * 4),
        }
    return {k: (sum(p.numel() for p in m.parameters()), nbytes(m)) for k, m in parts.items()}


def kv_cache_bytes(tokens):
    t = GlmImageConfig().text_config
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    return tokens * t.num_hidden_layers * 2 * t.num_key_value_heads * head_dim * 2  # K and V, bf16, no CFG


def main():
    print("part | parameters | weights")
    ar = {}
    for q in ("none", "int8", "int4"):
        n, ar[q] = ar_stage(q)
        print(f"AR stage ({'bf16' if q == 'none' else q}) | {n / GB:.2f} B | {ar[q] / GB:.1f} GB")
    dit = dit_parts()
    for k, (n, b) in dit.items():
        print(f"{k} (bf16) | {n / GB:.2f} B | {b / GB:.2f} GB")
    print(f"DiT decoder in all (bf16) | {sum(n for n, _ in dit.values()) / GB:.2f} B | "
          f"{sum(b for _, b in dit.values()) / GB:.1f} GB")
    for side in (1024, 2048):  # the prompt (~100 tokens), the preview grid (256) and the target grid
        tokens = 100 + 256 + (side // 32) ** 2
        print(f"AR KV cache at {side}x{side} ({tokens} tokens) | | {kv_cache_bytes(tokens) / GB:.2f} GB")
    decoder = sum(b for _, b in dit.values())
    modes = {"bf16": ar["none"], "int8": ar["int8"], "int4": ar["int4"]}
    print("\nGPU memory left after the weights (GB; negative: does not fit), a 'N GB' card taken as N GiB; "
          "activations, the CUDA context and the DiT's working memory come on top, not included")
    print("GPU | " + " | ".join(f"AR {m} alone" for m in modes) + " | " + " | ".join(f"AR {m} + DiT" for m in modes))
    for gpu in (12, 16, 24, 48):
        cap = gpu * 2 ** 30
        print(f"{gpu} GB | " + " | ".join(f"{(cap - b) / GB:.1f}" for b in modes.values()) + " | " +
              " | ".join(f"{(cap - b - decoder) / GB:.1f}" for b in modes.values()))


if __name__ == "__main__":
    main()
