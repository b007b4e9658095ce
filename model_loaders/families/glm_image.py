"""GLM-Image (zai-org) through transformers' `GlmImageForConditionalGeneration` (its AR stage) and diffusers'
`GlmImagePipeline` (its DiT decoder, optional: the ``glm-image`` extra).

Layout of a text-to-image generation, as transformers' `GlmImageProcessor` and `GlmImageModel.get_rope_index`
build it:

    prompt:  chat template(text) "<sop>{H} {W}<eop><sop>{h} {w}<eop>" <image start>   (the processor's ids)
    AR:      h*w preview codes, then H*W target codes, then <image end>; no row-end tokens

- H x W: the target grid, one token per 32x32 pixels; h x w: the preview grid (about 16x16) the processor derives;
- codes are vocabulary ids ``0 .. V-1`` (V = vq_config.num_embeddings) and the LM head's first V rows: engine id c
  is vocabulary id c; <image start> / <image end> (ids V, V+1) are never sampled here;
- positions (M-RoPE): text token p -> (p, p, p); preview (r, c) -> (L, L + r, L + c) with L the prompt length;
  target (r, c) -> (L', L' + r, L' + c) with L' = L + max(h, w);
- CFG: none in the AR stage (the released pipeline samples it with plain ``generate(do_sample=True)`` and the
  checkpoint's generation_config.json); guidance (1.5) belongs to the DiT, which the decoder below runs. A cfg_scale
  other than 1 still works here (negative prompt in the same layout) but is not what the released model does;
- the DiT decodes the target codes upsampled 2x (nearest) with the prompt's quoted text as glyphs.

Two grids, one contract grid each (`load_model` gives the target stage; its `preceding_stage()` and `prompt_after`):
docs/MODELS.md, "GLM-Image".
"""
from __future__ import annotations

import copy
import importlib.util
import json
import math
import os
import warnings

import torch

from ..contract import EncodedPrompt, ImageGeometry, check_texts
from ..family import ModelFamily, config_names
from .glm_image_folder import check_folder, has_dit, layout_folders, read_generation_config
from .glm_image_refs import MAX_REFERENCES, ReferencePrompt, reference_prompt, reference_rope
from .hf_common import SharedVocabImageModel

PIXELS_PER_TOKEN = 32  # GlmImageProcessor._get_target_shape's factor
MAX_SIDE = 2048  # the largest side GLM-Image generates (its model card: 1024 to 2048 pixels)
DIT_STEPS = 50  # GlmImagePipeline's num_inference_steps default
DIT_GUIDANCE = 1.5  # GlmImagePipeline's guidance_scale default
REQUIREMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "requirements-glm-image.txt")  # the pack's, beside requirements.txt
MISSING_DIFFUSERS = (f"GLM-Image's decoder (its DiT) needs diffusers: pip install -r {REQUIREMENTS} (in the Python "
                     f"that runs SpecAR, e.g. ComfyUI's); without it GLM-Image gives image tokens only")
NEEDS_TRANSFORMERS_5 = (f"GLM-Image needs transformers >= 5 (its GlmImage classes), you have {{have}}: "
                        f"pip install -r {REQUIREMENTS} (in the Python that runs SpecAR, e.g. ComfyUI's)")
# the sizes zai-org recommends (W x H), each a multiple of 32
RESOLUTIONS = ("1024x1024", "1280x1280", "1568x1056", "1056x1568", "1472x1088", "1088x1472", "1728x960", "960x1728",
               # larger ones of its 1024 to 2048 range: squares, 16:9 and 3:2
               "1536x1536", "2048x2048", "2048x1152", "1152x2048", "1536x1024", "1024x1536", "2048x1376", "1376x2048")


def token_counts(width: int, height: int) -> str:
    """What the AR stage samples at W x H, in words: '256 + 1024 tokens (preview grid 16x16, image grid 32x32)'."""
    (H, W), (h, w) = grids(width, height)
    return f"{h * w} + {H * W} tokens (preview grid {w}x{h}, image grid {W}x{H})"


def check_size(width: int, height: int) -> None:
    """GLM-Image generates W x H pixels with W and H multiples of 32 (its processor's token size, the DiT's patch)
    up to 2048; anything else is a ValueError naming the rule."""
    for name, v in (("width", width), ("height", height)):
        if isinstance(v, bool) or not isinstance(v, int) or v < PIXELS_PER_TOKEN or v > MAX_SIDE \
                or v % PIXELS_PER_TOKEN:
            raise ValueError(f"GLM-Image generates sizes whose width and height are multiples of {PIXELS_PER_TOKEN} "
                             f"from {PIXELS_PER_TOKEN} to {MAX_SIDE} pixels (recommended: {', '.join(RESOLUTIONS)}); "
                             f"got {name} {v!r}")


def grids(width: int, height: int):
    """((H, W) target tokens, (h, w) preview tokens), exactly as GlmImageProcessor._get_target_shape."""
    H, W = height // PIXELS_PER_TOKEN, width // PIXELS_PER_TOKEN
    half = PIXELS_PER_TOKEN // 2
    return (H, W), (int(math.sqrt(H / W) * half), int(math.sqrt(W / H) * half))


def load_processor(folder: str):
    if not os.path.isfile(os.path.join(folder, "tokenizer_config.json")):
        raise ValueError(f"GLM-Image's processor is missing: {folder!r} has no tokenizer_config.json (the released "
                         f"layout keeps it in processor/ beside vision_language_encoder/)")
    from transformers import GlmImageProcessor
    try:
        return GlmImageProcessor.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"could not load GLM-Image's processor from {folder!r}: {e}") from e


class GlmImageARModel(SharedVocabImageModel):
    family = "glm_image"
    stage = "target"

    def __init__(self, folder: str, device=None, dtype=None, width=None, height=None, device_map=None,
                 max_memory=None, offload_folder=None, attn_implementation=None, quantize=None, dit_steps=DIT_STEPS):
        super().__init__()
        import transformers
        if getattr(transformers, "GlmImageForConditionalGeneration", None) is None:
            raise ValueError(NEEDS_TRANSFORMERS_5.format(have=transformers.__version__))
        from transformers import GlmImageForConditionalGeneration

        check_folder(folder)  # every missing file named at once
        ar_folder, proc_folder, self.pipeline_folder = layout_folders(folder)
        self._open_folder(folder, device, dtype, "glm_image")  # named after the folder asked for
        self.folder = ar_folder  # the weights' folder (drafters and the fingerprint sit beside them)
        self.processor = load_processor(proc_folder)
        if width is None or height is None:  # the processor's own default size
            width, height = width or self.processor.target_w, height or self.processor.target_h
        check_size(width, height)
        self.width, self.height = width, height
        (H, W), (h, w) = grids(width, height)
        self.target_grid, self.preview_grid = (H, W), (h, w)
        mc = self._load_transformers_model(GlmImageForConditionalGeneration, ar_folder, device_map, max_memory,
                                           offload_folder, attn_implementation, quantize, "model.language_model.layers")
        V = int(mc.vq_config.num_embeddings)
        if not (mc.image_start_token_id >= V and mc.image_end_token_id >= V
                and mc.text_config.vision_vocab_size > V):
            raise ValueError(f"{os.path.join(ar_folder, 'config.json')}: image start / end ids "
                             f"{mc.image_start_token_id} / {mc.image_end_token_id} and vision_vocab_size "
                             f"{mc.text_config.vision_vocab_size} must follow the {V} codes")
        self.geometries = {"preview": ImageGeometry(height=h, width=w, vocab_size=V),
                           "target": ImageGeometry(height=H, width=W, vocab_size=V)}
        self.geometry = self.geometries["target"]
        gen = read_generation_config(ar_folder)  # what the released pipeline samples with
        top_k = int(gen.get("top_k") or 0) if gen.get("do_sample", True) else 0
        self.default_sampling = {"cfg_scale": 1.0, "top_k": min(top_k, V),
                                 "temperature": float(gen.get("temperature", 1)), "top_p": float(gen.get("top_p", 1))}
        self._use_backbone(self.model.model.language_model, mc.text_config)
        self._map_image_codes(list(range(V)), [])
        if isinstance(dit_steps, bool) or not isinstance(dit_steps, int) or dit_steps < 1:
            raise ValueError(f"dit_steps must be an int >= 1 (the DiT's denoising steps; released: {DIT_STEPS}), "
                             f"got {dit_steps!r}")
        self.dit_steps = dit_steps
        self.decoder_problem = None  # why decode_tokens gives no image (None: it decodes)
        if not has_dit(self.pipeline_folder):
            self.decoder_problem = (f"no DiT in {folder!r} (the released layout's transformer/, vae/, text_encoder/, "
                                    "tokenizer/ and scheduler/ beside model_index.json): image tokens only")
        elif importlib.util.find_spec("diffusers") is None:
            self.decoder_problem = MISSING_DIFFUSERS
            warnings.warn(MISSING_DIFFUSERS, stacklevel=2)
        self._pipeline = None
        self._prefill_grids = None  # set while `start` prefills: the prompt's reference grids (() for none)
        self._stages = {"target": self}  # shared by the stage objects

    # -- the two stages ------------------------------------------------------------------------
    def preceding_stage(self):
        """The target stage's preview stage (same weights): geometry h x w, prompt = the text layout; None for the
        preview stage itself."""
        return self._as_stage("preview") if self.stage == "target" else None

    def _as_stage(self, stage: str) -> "GlmImageARModel":
        """The model as `stage`: one object per stage, kept (compiled steps and measured costs are kept per model
        object), with this one's public settings (random_drafter_seed, name, ...)."""
        view = self._stages.get(stage)
        if view is None:
            view = self._stages[stage] = copy.copy(self)
            for k in [k for k in view.__dict__ if k.startswith(("_graph", "_tree_memo"))]:
                del view.__dict__[k]  # per-stage caches: a session cache belongs to one geometry
            view.stage, view.geometry = stage, self.geometries[stage]
        view.__dict__.update({k: v for k, v in self.__dict__.items()
                              if not k.startswith("_") and k not in ("stage", "geometry")})
        return view

    def _grid_prompt_tokens(self) -> int:
        """Preview codes at the end of this stage's prompts (the target stage's)."""
        return 0 if self.stage == "preview" else self.geometries["preview"].num_image_tokens

    # -- prompts ---------------------------------------------------------------------------
    def text_ids(self, text: str) -> list:
        """The released pipeline's AR prompt: its chat template and size suffix, through the processor."""
        messages = [[{"role": "user", "content": [{"type": "text", "text": text}]}]]
        out = self.processor.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt",
                                                 processor_kwargs=dict(target_h=self.height, target_w=self.width))
        ids = out["input_ids"][0].tolist()
        p = self.processor
        (H, W), (h, w) = self.target_grid, self.preview_grid
        suffix = p.tokenizer(f"{p.grid_bos_token}{H} {W}{p.grid_eos_token}{p.grid_bos_token}{h} {w}{p.grid_eos_token}"
                             f"{p.bos_token}", add_special_tokens=False).input_ids
        if ids[-len(suffix):] != suffix:  # a processor that took another size would give other grids, silently
            raise ValueError(f"GLM-Image's processor did not build the {self.width}x{self.height} layout "
                             f"(its prompt does not end with the grids {H}x{W} and {h}x{w}): transformers too old?")
        return ids

    def encode_prompt(self, text: str, negative_text: str = "") -> EncodedPrompt:
        if self.stage != "preview":
            raise ValueError("GLM-Image's target grid follows its preview grid: specar.generate(model, text) generates "
                             "both; a prompt of the target grid alone is model.prompt_after(text, preview codes)")
        check_texts(text, negative_text)
        cond, uncond = self.text_ids(text), self.text_ids(negative_text)
        return EncodedPrompt(cond=cond, uncond=uncond, text=text, negative_text=negative_text)

    max_reference_images = MAX_REFERENCES

    def reference_prompt(self, text: str, images, negative_text: str = "") -> ReferencePrompt:
        """Image-to-image: the target grid's prompt after 1 or 2 reference images (PIL, or float tensors 0..1
        [H, W, C] / [B, H, W, C]); `specar.generate(model, text, images=[...])` samples the target grid from it."""
        if self.stage != "target":
            raise ValueError("GLM-Image's image-to-image samples the target grid: use the model load_model gives")
        return reference_prompt(self, text, images, negative_text)

    def prompt_after(self, text: str, preview, negative_text: str = "") -> EncodedPrompt:
        """The target stage's prompt: the text layout followed by the preview codes ([h, w] or [h * w])."""
        check_texts(text, negative_text)
        g = self.geometries["preview"]
        codes = torch.as_tensor(preview).flatten()
        if codes.numel() != g.num_image_tokens or codes.min() < 0 or codes.max() >= g.vocab_size:
            raise ValueError(f"preview must be the {g.height}x{g.width} preview grid's codes (0..{g.vocab_size - 1}), "
                             f"got {tuple(torch.as_tensor(preview).shape)}")
        codes = codes.tolist()
        return EncodedPrompt(cond=self.text_ids(text) + codes, uncond=self.text_ids(negative_text) + codes,
                             text=text, negative_text=negative_text)

    # -- positions -------------------------------------------------------------------------
    def rope_positions(self, positions: torch.Tensor, text_len: torch.Tensor) -> torch.Tensor:
        """Sequence positions [R, T] -> M-RoPE positions [3, R, T] (text, preview grid, target grid), as
        get_rope_index places them; text_len [R, 1]: each row's text prompt length L."""
        (h, w), (H, W) = self.preview_grid, self.target_grid
        n1 = h * w
        j = positions - text_len
        k = (j - n1).clamp(min=0)
        jp = j.clamp(0, n1 - 1)
        L2 = text_len + max(h, w)
        prev, tgt = (j >= 0) & (j < n1), j >= n1
        t = torch.where(tgt, L2, torch.where(prev, text_len, positions))
        rows = torch.where(tgt, L2 + k // W, torch.where(prev, text_len + jp // w, positions))
        cols = torch.where(tgt, L2 + k % W, torch.where(prev, text_len + jp % w, positions))
        return torch.stack([t, rows, cols])

    def start(self, prompt, *args, **kwargs):
        self._prefill_grids = prompt.grids if isinstance(prompt, ReferencePrompt) else ()
        try:
            return super().start(prompt, *args, **kwargs)
        finally:
            self._prefill_grids = None

    def _run(self, embeds, positions, allowed, cache, slots):
        if self._prefill_grids is not None:  # the prefill: its last column is each row's last prompt id
            cache.glm_grids = self._prefill_grids
            cache.glm_text_len = positions[:, -1:] + 1 - (0 if cache.glm_grids else self._grid_prompt_tokens())
        if cache.glm_grids:  # image-to-image: the references' grids in the prompt, the target grid after it
            rope = reference_rope(positions, cache.glm_text_len, cache.glm_grids, self.target_grid)
        else:
            rope = self.rope_positions(positions, cache.glm_text_len)
        return super()._run(embeds, rope, allowed, cache, slots)

    # -- decoding --------------------------------------------------------------------------
    def decode_tokens(self, tokens: torch.Tensor, prompt: EncodedPrompt = None):
        """Target codes [B, H, W] -> PIL images through the released pipeline's DiT (its CFG, 2x upsampled codes,
        the glyphs of `prompt`'s text: the EncodedPrompt the codes came from, `GenerationResult.prompt`); None for
        the preview stage or without the DiT (``decoder_problem`` says why). The DiT's noise is seeded from the
        codes: the same tokens give the same pixels (same image as AR, decoded too)."""
        if self.stage != "target" or self.decoder_problem is not None:
            return None
        if not isinstance(prompt, EncodedPrompt):
            raise ValueError(f"GLM-Image's DiT renders the text of the prompt the codes came from: "
                             f"decode_tokens(tokens, prompt=result.prompt), got prompt {type(prompt).__name__}")
        pipe = self.dit_pipeline()
        B, H, W = tokens.shape
        up = upsampled(tokens)
        refs = {}
        if isinstance(prompt, ReferencePrompt):  # image-to-image: the DiT sees the references and their codes
            refs = dict(image=list(prompt.images),
                        prior_token_image_ids=[torch.cat([upsampled(c[None]).flatten() for c in prompt.codes]).long()
                                               .to(self.device)],
                        source_image_grid_thw=[torch.tensor([[1, 2 * h, 2 * w] for _, h, w in prompt.grids],
                                                            device=self.device)])
        out = []
        for b in range(B):
            res = pipe(prompt=prompt.text, height=self.height, width=self.width, guidance_scale=DIT_GUIDANCE, **refs,
                       prior_token_ids=up[b].long().reshape(1, -1).to(self.device), num_inference_steps=self.dit_steps,
                       generator=torch.Generator().manual_seed(hash(tuple(tokens[b].flatten().tolist())) % 2 ** 63))
            out.append(res.images[0])
        return out

    def decode_preview(self, tokens: torch.Tensor):
        """The live preview of either grid: each code coloured by its VQ codebook vector's first three principal
        components (one pixel per token; the DiT is far too slow to run every few steps)."""
        from PIL import Image
        colors = self._stages["target"].__dict__.get("_code_colors")
        if colors is None:
            book = self.model.model.vqmodel.quantize.embedding.weight.detach().float().cpu()
            book = book - book.mean(0)
            _, _, v = torch.linalg.svd(book, full_matrices=False)
            pc = book @ v[:3].T
            lo, hi = pc.min(0).values, pc.max(0).values
            colors = ((pc - lo) / (hi - lo).clamp(min=1e-9) * 255).round().to(torch.uint8)
            self._stages["target"]._code_colors = colors
        return [Image.fromarray(colors[t.long()].numpy()) for t in tokens.cpu()]

    def dit_pipeline(self):
        """diffusers' GlmImagePipeline over the pipeline folder, sharing this AR model and processor (loaded once)."""
        if self._pipeline is None:
            try:
                from diffusers import GlmImagePipeline
                from diffusers.utils import logging as diffusers_logging
            except ImportError as e:
                raise ImportError(MISSING_DIFFUSERS) from e
            level = diffusers_logging.get_verbosity()
            diffusers_logging.set_verbosity_error()  # else it prints the whole AR model we hand it ("cannot verify")
            try:
                self._pipeline = GlmImagePipeline.from_pretrained(
                    self.pipeline_folder, vision_language_encoder=self.model, processor=self.processor,
                    dtype=self._dtype, local_files_only=True).to(self.device)
            finally:
                diffusers_logging.set_verbosity(level)
            self._pipeline.set_progress_bar_config(disable=True)
        return self._pipeline


def upsampled(codes: torch.Tensor) -> torch.Tensor:
    """[B, h, w] codes -> [B, 1, 2h, 2w] (nearest), the DiT's grid, as GlmImagePipeline._upsample_token_ids."""
    B, h, w = codes.shape
    return torch.nn.functional.interpolate(codes.reshape(B, 1, h, w).float(), scale_factor=2, mode="nearest")


def is_glm_image(folder: str, config) -> bool:
    model_type, archs = config_names(config)
    if model_type == "glm_image" or "GlmImageForConditionalGeneration" in archs:
        return True
    index = os.path.join(folder, "model_index.json")
    if config is None and os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                return (json.load(f) or {}).get("_class_name") == "GlmImagePipeline"
        except (OSError, ValueError, AttributeError):
            return False
    return False


def size_options(folder: str, w: int, h: int) -> dict:
    check_size(w, h)
    return {"width": w, "height": h}


FAMILY = ModelFamily(
    name=GlmImageARModel.family, label="GLM-Image", files="released layout (model_index.json) or its AR folder",
    load=GlmImageARModel, detect=is_glm_image, offload=True,
    sizes=f"GLM-Image W x H, multiples of 32 up to 2048 (1024x1024: {token_counts(1024, 1024)}; 2048x2048: "
          f"{token_counts(2048, 2048)})",
    size_options=size_options, transformers=True, resolutions=RESOLUTIONS, quantize=True, check=check_folder)
