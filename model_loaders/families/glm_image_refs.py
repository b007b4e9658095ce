"""GLM-Image's image-to-image prompt: one or two reference images through the released processor's chat template,
their VQ codes in place of the processor's image placeholders, and the M-RoPE positions transformers'
`GlmImageModel.get_rope_index` gives them.

Layout (each reference framed by <image start> ... <image end> in the template; the text after the images):

    prompt:  chat prefix  <image start> h1*w1 codes <image end> [<image start> h2*w2 codes <image end>]  text
             "<sop>{H} {W}<eop>" <image start>
    AR:      H*W target codes (no preview grid), then <image end>

- reference i's codes: the vision encoder's features (`get_image_features`) quantized by the VQ model
  (`get_image_tokens`), at the grid the image processor resized the image to (h_i x w_i);
- positions: a text token takes the next position (all three axes); reference i at sequence positions s_i ..
  s_i + h_i*w_i - 1 takes (P_i, P_i + r, P_i + c) with P_i the next position, which then advances by max(h_i, w_i);
  the target grid the same after the whole prompt.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..contract import EncodedPrompt, check_texts

MAX_REFERENCES = 2  # what GLM-Image's editing takes (its ComfyUI packs and the released pipeline's examples)


@dataclass
class ReferencePrompt(EncodedPrompt):
    """An image-to-image prompt: `grids` ((s, h, w) per reference: its first sequence position and grid, the same in
    both branches), `images` (the PIL references, for the DiT) and `codes` ([h, w] per reference)."""

    grids: tuple = ()
    images: list = field(default_factory=list)
    codes: list = field(default_factory=list)


def as_pil_images(images) -> list:
    """One or two references -> RGB PIL images. Each: a PIL image, or a float tensor in 0..1 [H, W, C] / [1, H, W, C]
    (ComfyUI's IMAGE) / [B, H, W, C] (B images). A ValueError names anything else."""
    from PIL import Image
    if images is None or isinstance(images, (Image.Image, torch.Tensor)):
        images = [images]
    if not isinstance(images, (list, tuple)):
        raise ValueError(f"images must be a list of PIL images or [H, W, C] tensors (0..1), got "
                         f"{type(images).__name__}")
    out = []
    for i, im in enumerate(images):
        if isinstance(im, Image.Image):
            out.append(im.convert("RGB"))
        elif isinstance(im, torch.Tensor) and im.dim() in (3, 4) and im.shape[-1] in (3, 4) \
                and im.is_floating_point():
            for one in (im if im.dim() == 4 else im[None]):
                rgb = (one[..., :3].detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
                out.append(Image.fromarray(rgb))
        else:
            what = tuple(im.shape) if isinstance(im, torch.Tensor) else type(im).__name__
            raise ValueError(f"images[{i}] must be a PIL image or a float tensor [H, W, C] / [B, H, W, C] in 0..1 "
                             f"(C = 3 or 4), got {what}")
    if not 1 <= len(out) <= MAX_REFERENCES:
        raise ValueError(f"GLM-Image edits with 1 to {MAX_REFERENCES} reference images, got {len(out)}")
    return out


def reference_ids(model, text: str, images: list, codes=None):
    """(prompt ids with the references' codes in place of the placeholders, [(s, h, w)] per reference, codes
    [h1*w1 + ...]): the released processor's i2i prompt at the model's size; `codes`: the references' codes from an
    earlier call (the other branch), else computed."""
    p, mc = model.processor, model.model.config
    messages = [[{"role": "user", "content": [{"type": "image", "image": im} for im in images]
                  + [{"type": "text", "text": text}]}]]
    out = p.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt",
                                processor_kwargs=dict(target_h=model.height, target_w=model.width))
    ids = out["input_ids"][0]
    thw = out["image_grid_thw"][:len(images)]  # the references' grids, then the target grid
    H, W = model.target_grid
    if len(out["image_grid_thw"]) != len(images) + 1 or out["image_grid_thw"][-1].tolist() != [1, H, W]:
        raise ValueError(f"GLM-Image's processor did not build the image-to-image layout for {len(images)} "
                         f"reference(s) at {model.width}x{model.height} (grids {out['image_grid_thw'].tolist()})")
    if codes is None:
        with torch.no_grad():
            feats = model.model.get_image_features(out["pixel_values"].to(model.device), thw.to(model.device))
            codes = model.model.get_image_tokens(feats.pooler_output, thw).flatten().cpu()
    holes = (ids == mc.image_token_id).nonzero().flatten()
    if holes.numel() != codes.numel():
        raise ValueError(f"GLM-Image's prompt has {holes.numel()} image placeholders for {codes.numel()} "
                         f"reference codes: the processor's chat template does not place the images")
    ids = ids.clone()
    ids[holes] = codes
    grids, k = [], 0
    for t, h, w in thw.tolist():
        n = t * h * w
        s = int(holes[k])
        if t != 1 or holes[k + n - 1] != s + n - 1 or ids[s - 1] != mc.image_start_token_id \
                or ids[s + n] != mc.image_end_token_id:
            raise ValueError("GLM-Image's processor did not frame a reference image as <image start> codes "
                             "<image end> (what its M-RoPE positions need): its chat template is not the released one")
        grids.append((s, h, w))
        k += n
    return ids.tolist(), tuple(grids), codes


def reference_prompt(model, text: str, images, negative_text: str = "") -> ReferencePrompt:
    """Both branches' i2i prompts (the negative text with the same references)."""
    check_texts(text, negative_text)
    pil = as_pil_images(images)
    cond, grids, codes = reference_ids(model, text, pil)
    uncond, grids_u, _ = reference_ids(model, negative_text, pil, codes)
    if grids_u != grids:  # the references come before the text: both branches place them alike
        raise ValueError(f"GLM-Image's chat template places the references after the text ({grids} vs {grids_u}); "
                         f"image-to-image needs them first, as the released template does")
    per_image = list(torch.split(codes, [h * w for _, h, w in grids]))
    return ReferencePrompt(cond=cond, uncond=uncond, text=text, negative_text=negative_text, grids=grids,
                           images=pil, codes=[c.view(h, w) for c, (_, h, w) in zip(per_image, grids)])


def reference_rope(positions: torch.Tensor, prompt_len: torch.Tensor, grids: tuple, target) -> torch.Tensor:
    """Sequence positions [R, T] -> M-RoPE positions [3, R, T] for an i2i prompt: `grids` ((s, h, w) per
    reference), prompt_len [R, 1] each row's prompt length, `target` (H, W) the grid sampled after it."""
    H, W = target
    text = positions.clone()  # a text token: the prompt position less what earlier references saved
    t, rows, cols = positions.clone(), positions.clone(), positions.clone()
    in_grid = torch.zeros_like(positions, dtype=torch.bool)
    before = 0  # positions the earlier references saved (h*w tokens on max(h, w) positions)
    for s, h, w in grids:
        n, base = h * w, s - before
        j = positions - s
        inside, jj = (j >= 0) & (j < n), j.clamp(0, n - 1)
        t = torch.where(inside, base, t)
        rows = torch.where(inside, base + jj // w, rows)
        cols = torch.where(inside, base + jj % w, cols)
        text = text - (j >= n).long() * (n - max(h, w))
        in_grid |= inside
        before += n - max(h, w)
    t, rows, cols = (torch.where(in_grid, a, text) for a in (t, rows, cols))
    k = (positions - prompt_len).clamp(min=0)
    gen, start = positions >= prompt_len, prompt_len - before
    return torch.stack([torch.where(gen, start, t), torch.where(gen, start + k // W, rows),
                        torch.where(gen, start + k % W, cols)])
