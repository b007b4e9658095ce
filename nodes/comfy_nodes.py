"""ComfyUI node classes (V1 API: NODE_CLASS_MAPPINGS, understood by every ComfyUI version).

Thin wrappers: parse widgets, call nodes/core.py, format outputs. ComfyUI modules are imported
inside the methods that need them, so this file imports without ComfyUI.
"""
from __future__ import annotations

from ..samplers.backends import BACKEND_PARAMS, BACKENDS, COUPLINGS, INITS, MAX_WINDOW
from ..samplers.engine import GenerationInterrupted
from . import core

CATEGORY = "SpecAR"

# widgets of every backend parameter: (ComfyUI type, options); tooltips come from BACKEND_PARAMS
PARAM_WIDGETS = {
    "window": ("INT", {"default": 16, "min": 1, "max": MAX_WINDOW,
                       "tooltip": "Draft tokens verified per forward. Paper defaults: SJD 16, SCD 16-64, SJD-PAC 64."}),
    "init": (list(INITS), {"default": "random",
                           "tooltip": "How new window positions are drafted (SJD paper): random (uniform), "
                                      "repeat_left/above (copy a neighbour), sample_left/above (sample its distribution)."}),
    "coupling": (list(COUPLINGS), {"default": "maximal",
                                   "tooltip": "SCD / SJD-PAC: how re-drafts are coupled to the previous draft. maximal "
                                              "(paper default; SJD-PAC's adaptive continuation) or gumbel."}),
    "coupling_strength": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.05,
                                    "tooltip": "SCD alpha: probability of a coupled re-draft (1.0 = paper default, 0 = SJD)."}),
    "tree_depth": ("INT", {"default": 3, "min": 1, "max": MAX_WINDOW,
                           "tooltip": "SJD-PAC proactive drafting: depth D of the tree after a rejection (paper: 3)."}),
    "tree_width": ("INT", {"default": 4, "min": 1, "max": 65536,
                           "tooltip": "SJD-PAC proactive drafting: candidates K at the rejection point (paper: 4; 1 = off)."}),
    "continuation": ("BOOLEAN", {"default": True,
                                 "tooltip": "SJD-PAC adaptive continuation: keep verifying after the first rejection (paper: on)."}),
}
assert set(PARAM_WIDGETS) >= {p for params in BACKEND_PARAMS.values() for p in params}, "a backend parameter has no widget"


class SpecARModelLoader:
    DESCRIPTION = "Load an autoregressive image model (the embedded demo model or a folder under models/specar)."

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": (core.model_choices(), {"tooltip": "demo: the small model shipped with SpecAR; other entries: "
                                                        "model folders under ComfyUI/models/specar"}),
            "device": (list(core.DEVICES), {"default": "auto", "tooltip": "auto: ComfyUI's device"}),
            "dtype": (list(core.DTYPES), {"default": "auto", "tooltip": "weights precision (auto: the model's own)"}),
        }}

    RETURN_TYPES = ("SPECAR_MODEL",)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("the loaded model, cached across runs",)
    FUNCTION = "load"
    CATEGORY = CATEGORY

    @classmethod
    def VALIDATE_INPUTS(cls, model, device, dtype):
        for name, value, allowed in (("model", model, core.model_choices()), ("device", device, core.DEVICES),
                                     ("dtype", dtype, core.DTYPES)):
            if value not in allowed:
                return f"{name} must be one of {', '.join(allowed)}; got {value!r}"
        return True

    def load(self, model, device="auto", dtype="auto"):
        _install_free_hook()
        return (core.load_cached(model, device, dtype),)


class SpecARSampler:
    DESCRIPTION = ("Generate an image with lossless speculative decoding. Every backend but the lossy ones (none "
                   "yet) samples exactly what plain AR sampling does, in fewer forward passes.")

    @classmethod
    def INPUT_TYPES(cls):
        required = {
            "model": ("SPECAR_MODEL", {"tooltip": "from the SpecAR model loader"}),
            "prompt": ("STRING", {"multiline": True, "default": "a large red circle on a blue background",
                                  "tooltip": "what to draw"}),
            "negative_prompt": ("STRING", {"multiline": True, "default": "",
                                           "tooltip": "the unconditional branch of CFG (empty: the model's default)"}),
            "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF, "control_after_generate": True,
                             "tooltip": "same seed, backend and parameters give the same image"}),
            "backend": (list(BACKENDS), {"default": "sjd_pac",
                                         "tooltip": "ar: plain sampling; sjd: Speculative Jacobi Decoding; scd: coupled "
                                                    "SJD; sjd_pac: proactive drafting + adaptive continuation"}),
            "cfg_scale": ("FLOAT", {"default": -1.0, "min": -1.0, "max": 30.0, "step": 0.1,
                                    "tooltip": "classifier-free guidance; -1 = the model's recommended value "
                                               "(demo 3, Lumina-mGPT 3, Emu3 3, Janus-Pro 5)"}),
            "temperature": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 5.0, "step": 0.05,
                                      "tooltip": "1.0 as in the papers; 0 = greedy"}),
            "top_k": ("INT", {"default": 0, "min": 0, "max": 65536,
                              "tooltip": "0 = the model's recommended value (Lumina-mGPT 2000, Emu3 2048, Janus-Pro 1000)"}),
            "top_p": ("FLOAT", {"default": 1.0, "min": 0.01, "max": 1.0, "step": 0.01, "tooltip": "1.0 = off"}),
        }
        for name, (kind, opts) in PARAM_WIDGETS.items():
            required[name] = (kind, dict(opts))
        required["batch_size"] = ("INT", {"default": 1, "min": 1, "max": 64, "tooltip": "images generated at once"})
        return {"required": required}

    RETURN_TYPES = ("IMAGE", "SPECAR_TOKENS", "STRING", "IMAGE")
    RETURN_NAMES = ("image", "tokens", "stats", "acceptance_heatmap")
    OUTPUT_TOOLTIPS = ("the generated images", "the image tokens (for the decode node)",
                       "statistics as JSON: forward passes, step compression, latency, accepted lengths",
                       "per token: how many tokens its step accepted (yellow = long accepted runs)")
    FUNCTION = "sample"
    CATEGORY = CATEGORY
    OUTPUT_NODE = True

    @classmethod
    def VALIDATE_INPUTS(cls, backend, init, coupling):
        # ComfyUI does not always check combo values itself: do it here, with the allowed values
        for name, value, allowed in (("backend", backend, BACKENDS), ("init", init, INITS),
                                     ("coupling", coupling, COUPLINGS)):
            if value not in allowed:
                return f"{name} must be one of {', '.join(allowed)}; got {value!r}"
        return True

    def sample(self, model, prompt, negative_prompt, seed, backend, cfg_scale, temperature, top_k, top_p,
               batch_size=1, **widgets):
        check = self.VALIDATE_INPUTS(backend, widgets.get("init", "random"), widgets.get("coupling", "maximal"))
        if check is not True:
            raise ValueError(check)
        progress, interrupt = _comfy_progress(), _comfy_interrupt()
        try:
            image, tokens, stats, heat, text = core.run_sampler(
                model, prompt, negative_prompt, seed, backend, cfg_scale, temperature, top_k, top_p,
                batch_size=batch_size, progress=progress, interrupt=interrupt, **widgets)
        except GenerationInterrupted:
            import comfy.model_management as mm
            raise mm.InterruptProcessingException()
        return {"ui": {"text": [text], "specar_stats": [stats]}, "result": (image, tokens, stats, heat)}


class SpecARDecode:
    DESCRIPTION = "Decode SpecAR image tokens to an image with the model's own VQ decoder."

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"tokens": ("SPECAR_TOKENS", {"tooltip": "tokens output of the SpecAR sampler"})}}

    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("image",)
    OUTPUT_TOOLTIPS = ("the decoded images",)
    FUNCTION = "decode"
    CATEGORY = CATEGORY

    def decode(self, tokens):
        return (core.decode_tokens(tokens),)


def _comfy_progress():
    try:
        import comfy.utils
    except ImportError:
        return None
    bar = {}

    def progress(done, total):
        if "bar" not in bar:
            bar["bar"] = comfy.utils.ProgressBar(total)
        bar["bar"].update_absolute(done, total)

    return progress


def _comfy_interrupt():
    try:
        import comfy.model_management as mm
    except ImportError:
        return None
    return mm.processing_interrupted


_hooked = []


def _install_free_hook():
    """Free our cached model when ComfyUI frees memory (POST /free, 'unload models')."""
    if _hooked:
        return
    try:
        import comfy.model_management as mm
    except ImportError:
        return
    original = mm.unload_all_models

    def unload_all_models(*args, **kwargs):
        core.free_models()
        return original(*args, **kwargs)

    mm.unload_all_models = unload_all_models
    _hooked.append(True)


NODE_CLASS_MAPPINGS = {
    "SpecARModelLoader": SpecARModelLoader,
    "SpecARSampler": SpecARSampler,
    "SpecARDecode": SpecARDecode,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "SpecARModelLoader": "SpecAR Model Loader",
    "SpecARSampler": "SpecAR Sampler (speculative decoding)",
    "SpecARDecode": "SpecAR Decode Tokens",
}
