"""The three nodes' inputs and outputs, declared once (in the language of widgets.py), ComfyUI-free: v3.py and v1.py
generate the classes from them; each backend's inputs come from its schema (`samplers.backends.SCHEMAS`) and each
family's help from its `ModelFamily`, so a backend or family registered there appears here with no change
(docs/NODES.md, "How the pack is built"; how values are checked: its "Nodes", Validation)."""
from __future__ import annotations

import re
from typing import Callable

from ..model_loaders.precision.quantize import QUANTIZE_MODES
from ..model_loaders.registry import FAMILIES
from ..model_loaders.resolutions import MODEL_DEFAULT as MODEL_DEFAULT_SIZE
from ..model_loaders.resolutions import OFFLOADS, RESOLUTIONS, sizes_help
from ..samplers import backends as _backends
from ..samplers.api import REPRODUCIBLE_DEFAULT
from ..samplers.sampling import SamplingField
from .widgets import NodeSpec, Output, Switch, Widget

CATEGORY = "SpecAR"
SEED_MAX = 0xFFFFFFFFFFFFFFFF
INT_MAX = 2**31 - 1
MODEL_TYPE = "SPECAR_MODEL"
DRAFTER_FOLDER = "specar_drafters"  # ComfyUI/models/specar_drafters/<drafter folder>
TOKENS_TYPE = "SPECAR_TOKENS"
DEVICES = ("auto", "cpu", "cuda")
TOP_K_MAX = 65536  # above every image vocabulary of the families (Emu3's 32768 codes the largest)


def devices() -> list:
    """The loader's device choices: cuda only where this torch sees a CUDA GPU, so that ComfyUI refuses it
    at queue time elsewhere (under the device input, naming auto and cpu)."""
    import torch
    return [d for d in DEVICES if d != "cuda" or torch.cuda.is_available()]
DTYPES = ("auto", "float32", "bfloat16", "float16")
PREVIEW_MODES = ("image", "image + acceptance", "off")


# backend parameters -> widgets (each backend's own, with its real default)

BESIDE_MODEL = "(beside the model)"  # drafter folder choice: the drafter shipped next to the model's weights


def is_advanced(backend: str, param: str) -> bool:
    """An input shown only on request: a backend parameter not declared `essential` (samplers/drafters/params.py)."""
    return param not in _backends.SCHEMAS[backend].essential_params


def node_text(text: str) -> str:
    """A backend's help as a node tooltip: the library's help names the API's `preset='paper'` (no node
    input), documents in the repository and issue numbers, none of which a ComfyUI user has."""
    text = re.sub(r"\s*\(preset='paper'\)", "", text)  # "SJD paper: random (preset='paper')"
    text = re.sub(r";\s*preset='paper'(?=\))", "", text)  # "topk (EAGLE-2; preset='paper')"
    text = text.replace("preset='paper': ", "paper setting: ")
    text = re.sub(r"\s*\(docs/[\w/-]+\.md\)", "", text)  # "... on a CPU (docs/BENCHMARKS.md)"
    text = re.sub(r"(;\s*| of )docs/[\w/-]+\.md(, [^;.)]*)?", "", text)  # "(lossless; docs/X.md)", "; docs/X.md, why"
    text = re.sub(r"\bissues? \d+(: |, )?", "", text)
    for jargon, plain in PLAIN_WORDS:
        text = text.replace(jargon, plain)
    return text


# research shorthand in the library's help -> what a node user reads instead
PLAIN_WORDS = (
    ("accepted with about 1 - TV(p, q)", "accepted about as often as the drafter agrees with the model"),
    ("the drafter's q", "the drafter's probabilities"),
    (", grown greedily as Sequoia's", ", grown greedily"),
    ("in every bench regime", "in every setting measured"),
    ("in any bench regime", "in any setting measured"),
    ("(a coupled Jacobi window stuck in a fixed point)", "(a window stuck repeating itself)"),
    ("alpha: probability", "probability"),
    ("bisection adaptation", "adaptation"),
    ("the bisection may grow", "the adaptation may grow"),
    (" (d in (0, 10))", ""),
    ("d in (0, 10) ", ""),
    ("(latent-proximity neighbourhoods)", "(a draft close to the model's choice in the image decoder's codes counts "
     "as accepted)"),
    ("total-variation budget delta of the relaxation", "how much probability the relaxation may move (0: none)"),
    ("step compression", "tokens per forward"),
    ("Hawk paper: Medusa-style heads (paper setting: 4, our tree)", "Hawk paper: 4"),
    ("; Hawk paper: VSD", ""),
    ("EAGLE-2's trees (paper setting: 32)", "the paper's: 32"),
    ("(off: a fixed EAGLE-2 tree)", "(off: a fixed tree)"),
    ("EAGLE-2's deterministic top-k", "the k most likely children, chosen deterministically"),
    ("EAGLE drafter with adjacency-adaptive dynamic draft trees", "a trained drafter's tree of guesses, grown "
     "where neighbouring tokens were accepted"),
    ("Speculative Jacobi Decoding with coupled re-drafts", "SJD whose re-drafts stay close to the previous draft"),
    ("Speculative Jacobi Decoding", "a window of guessed tokens checked in one forward"),
    ("SJD with proactive drafting and adaptive continuation", "SJD that also drafts branches after a rejection"),
    ("spatial (horizontal + vertical) draft heads with a speculation cache", "trained heads guess the tokens to "
     "the right and below"),
    ("SCD whose window and draft init are chosen every step from this device's step cost, measured during the "
     "generation, and the acceptance seen so far", "SCD whose window is chosen every step from the step cost and "
     "acceptance it measures"),
    ("a Jacobi window over the rows ahead, drafted by trained spatial heads from the rows above and refined by the "
     "target, with proactive branches", "trained heads draft the rows ahead"),
    ("paper: topk (EAGLE-2)", "paper: topk"),
    ("rows below (T + d * row) kept in the speculation cache", "how many rows below are drafted too"),
)
# parameters that change nothing with same_image_as_ar on: a re-draft is then AR's own sample for the seed, however
# the backend would couple it (samplers/drafters/jacobi/drafter.py `_coupled_draft`)
MOOT_WHEN_SAME_IMAGE = ("coupling", "coupling_strength")
MOOT_NOTE = "No effect with same_image_as_ar on (a re-draft is then AR's own sample); it acts only with it off."


def shown(value) -> str:
    """A value as the node shows it: on / off for a switch."""
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def param_widget(p, label: str, drafter_choices: Callable[[str], list]) -> Widget:
    """The widget of one backend parameter (samplers/backends.py Param), default and range from its schema."""
    tooltip = f"{label}: {p.help}. Default {shown(p.default)}"
    if p.paper:
        tooltip += f"; {p.paper}"
    tooltip = node_text(tooltip) + "."
    for value, forced in p.implies:  # what the web extension sets when this value is picked
        tooltip += f" Choosing {shown(value)} sets " + ", ".join(f"{k} {shown(v)}" for k, v in forced) + "."
    if p.help.startswith("LOSSY"):
        tooltip += " Lossy settings need same_image_as_ar off (turning it on sets that too)."
    if p.name in MOOT_WHEN_SAME_IMAGE:
        tooltip += " " + MOOT_NOTE
    if p.folder_of:
        tooltip = tooltip.replace("; empty: ", f"; {BESIDE_MODEL}: ")  # the choice's own text, not the API's ""
        return Widget(p.name, "COMBO", tooltip.replace(f"Default {p.default}", f"Default {BESIDE_MODEL}") +
                      f" Folders with {p.folder_of} drafters under ComfyUI/models/{DRAFTER_FOLDER} are listed.",
                      default=BESIDE_MODEL, options=lambda kind=p.folder_of: [BESIDE_MODEL] + drafter_choices(kind))
    # for the web extension: choices that set another parameter (`Param.implies`), a lossy switch (sets
    # same_image_as_ar off)
    extra = {"specar_implies": {v: dict(forced) for v, forced in p.implies}} if p.implies else {}
    if p.help.startswith("LOSSY"):
        extra["specar_lossy"] = True
    if isinstance(p.default, bool):
        return Widget(p.name, "BOOLEAN", tooltip, default=p.default, extra=extra, source=p)
    if isinstance(p.default, int):
        return Widget(p.name, "INT", tooltip, default=p.default, min=int(p.lo), max=INT_MAX if p.hi is None else
                      int(p.hi), step=1, source=p)
    if isinstance(p.default, float):
        step = 0.01 if p.hi is not None and p.hi <= 1 else 0.05
        return Widget(p.name, "FLOAT", tooltip, default=p.default, min=p.lo, max=p.hi, step=step, source=p)
    if p.choices:
        return Widget(p.name, "COMBO", tooltip, default=p.default, options=tuple(p.choices), extra=extra, source=p)
    return Widget(p.name, "STRING", tooltip, default=p.default, source=p)


def backend_switch(drafter_choices: Callable[[str], list] = lambda kind: []) -> Switch:
    schemas = _backends.SCHEMAS  # read each time: a backend registered later appears too
    names = tuple(schemas)
    help_text = "; ".join(f"{s.label}: {short_help(s.description)}" for s in schemas.values())
    return Switch(
        "backend", f"how tokens are drafted and verified. {help_text}. Every lossless backend samples exactly what AR "
        "samples; only the chosen backend's parameters are shown.", default=_backends.DEFAULT_BACKEND, prefix=True,
        labels={n: s.label for n, s in schemas.items()},
        options={n: [flagged(param_widget(p, s.label, drafter_choices), specar_advanced=is_advanced(n, p.name),
                             specar_moot_when_same_image=p.name in MOOT_WHEN_SAME_IMAGE) for p in s.params]
                 for n, s in schemas.items()})


def short_help(description: str) -> str:
    """A backend's description as one clause of the backend tooltip: its first clause, without the authors
    ("(Teng et al.)") or notes in parentheses."""
    text = node_text(description)
    text = re.split(r"\. |; ", text, maxsplit=1)[0]
    text = re.sub(r"\s*\([^()]*\)", "", text)
    for jargon, plain in PLAIN_WORDS:
        text = text.replace(jargon, plain)
    return text.strip().rstrip(".")


def flagged(w: Widget, **flags: bool) -> Widget:
    """`w` with the web extension's flags that hold (specar_advanced, specar_moot_when_same_image: greyed out)."""
    w.extra = {**w.extra, **{k: True for k, on in flags.items() if on}}
    return w


MODEL_DEFAULT = "model default"
# what temperature and top_p held for "the loaded model's recommended value" before the sampling switch (prompts and
# workflows saved then: layouts.py and web/specar_layouts.js read them)
MODEL_TEMPERATURE, MODEL_TOP_P = -1.0, 0.0


def recommended(name: str) -> str:
    """Which families recommend a `name` (temperature, top_p) other than 1.0, in words."""
    named = [f"{s.variant} {getattr(s, name):g}" for f in FAMILIES.values() for s in f.sampling
             if getattr(s, name) != 1.0]
    return ", ".join(named + ["GLM-Image its generation_config.json's", "1.0 otherwise"])


def guidance_switch() -> Switch:
    recommended = "; ".join(s.describe() for f in FAMILIES.values() for s in f.sampling)
    return Switch("guidance", f"classifier-free guidance and top-k: the model's recommended values ({recommended}; "
                  "the values used are shown after the run) or custom values", default=MODEL_DEFAULT, options={
                      MODEL_DEFAULT: [],
                      "custom": [
                          Widget("cfg_scale", "FLOAT", "classifier-free guidance scale: 1 = no guidance, higher = "
                                 "closer to the prompt (0 = the unconditional branch alone)", default=3.0, min=0.0,
                                 max=100.0, step=0.1, source=SamplingField("cfg_scale")),
                          Widget("top_k", "INT", "keep the k most likely image tokens (0 = all tokens; at most the "
                                 f"model's image vocabulary, checked when the node runs, and at most {TOP_K_MAX})",
                                 default=256, min=0, max=TOP_K_MAX, step=1, source=SamplingField("top_k")),
                      ]})


# the nodes

def loader_spec(model_choices: Callable[[], list], allowed: Callable[[], dict] = dict) -> NodeSpec:
    """`allowed()`: {model: {input: the values that model allows}}, which the web extension narrows the lists to."""
    return NodeSpec(
        node_id="SpecARModelLoader",
        display_name="SpecAR Model Loader",
        description=("Load an autoregressive image model: the embedded demo model, or a model folder under "
                     "ComfyUI/models/specar (family recognised from its files). The model stays loaded across runs; "
                     "ComfyUI's Unload Models and memory pressure free it, and the next run loads it again."),
        inputs=[
            Widget("model", "COMBO", "demo: the small model shipped with SpecAR (runs on a CPU); other entries: "
                   "model folders under ComfyUI/models/specar (" +
                   "; ".join(f"{f.label}: {f.files}" for f in FAMILIES.values() if not f.builtin) + "), then "
                   "checkpoints already in your Hugging Face cache, by repo id (org/name; found without network "
                   "access). The size, quantize and offload lists show what the chosen model allows",
                   default="demo", options=model_choices, extra={"specar_allowed": allowed}),
            Widget("device", "COMBO", "where the model runs; auto: ComfyUI's device (cuda is listed where torch "
                   "sees a CUDA GPU)", default="auto", options=devices),
            Widget("dtype", "COMBO", "weights precision; auto: the model's recommended one (float32 on CPU)",
                   default="auto", options=DTYPES),
            # new inputs go after the old ones: saved workflows keep their positional values
            Widget("resolution", "COMBO", f"image size in pixels (W x H): model default, or a size the family offers "
                   f"({sizes_help()}); another size is refused naming what the model offers",
                   default=MODEL_DEFAULT_SIZE, options=RESOLUTIONS, optional=True),
            Widget("offload", "COMBO", "none: every weight on the device; auto: accelerate's big-model loading (GPU "
                   "first, the rest in CPU memory) for models larger than the GPU (transformers families, Emu3.5)",
                   default="none", options=OFFLOADS, optional=True),
            Widget("quantize", "COMBO", "weight-only quantization of the decoder's linear layers, done at load (on the "
                   "CPU, before the weights reach the GPU): int8 about half, int4 about a quarter of the bf16 weight "
                   "memory; the quantized model is the one sampled exactly. For " +
                   ", ".join(f.label for f in FAMILIES.values() if f.quantize) + "; not with offload auto",
                   default="none", options=QUANTIZE_MODES, optional=True),
        ],
        outputs=[Output("model", MODEL_TYPE, "the loaded model, cached across runs")],
    )


def sampler_spec(drafter_choices: Callable[[str], list] = lambda kind: []) -> NodeSpec:
    inputs = [
        Widget("model", MODEL_TYPE, "from the SpecAR Model Loader"),
        Widget("prompt", "STRING", "what to draw", default="a large red circle on a blue background",
               multiline=True),
        Widget("negative_prompt", "STRING", "the unconditional branch of classifier-free guidance "
               "(empty: the model's default)", default="", multiline=True),
        Widget("seed", "INT", "random seed. With same_image_as_ar on, the seed and sampling settings (prompt, size, "
               "guidance, temperature, top-p) give the same image with every lossless backend, any backend "
               "parameters, compile on or off, on any machine: plain AR's image (image b of a batch is the same at any "
               "batch size; only float rounding deciding a near-tie could change a token). With it off, the same "
               "seed, settings, backend and backend parameters give the same image on this machine, except auto with "
               "cost_model measured, whose window choices (and so its image) follow the step times it measures during "
               "each run: its image can change from run to run; every lossless backend samples the same distribution "
               "as AR", default=0, min=0, max=SEED_MAX,
               control_after_generate=True),
        backend_switch(drafter_choices),
        guidance_switch(),
        Switch("sampling", f"temperature and top-p: the loaded model's recommended values (temperature "
               f"{recommended('temperature')}; top-p {recommended('top_p')}; the values used are shown after the run) "
               "or custom values", default=MODEL_DEFAULT, options={MODEL_DEFAULT: [], "custom": [
                   Widget("temperature", "FLOAT", "sampling temperature: 1 = the model's distribution, 0 = greedy",
                          default=1.0, min=0.0, max=10.0, step=0.05, source=SamplingField("temperature")),
                   Widget("top_p", "FLOAT", "nucleus sampling: keep the most likely tokens up to this probability "
                          "mass (1.0 = off)", default=1.0, min=0.01, max=1.0, step=0.01,
                          source=SamplingField("top_p"))]}),
        Widget("batch_size", "INT", "images generated at once, each with its own random stream (the largest "
               "batch this model allows is checked before generating)", default=1, min=1, max=64, step=1),
        Widget("preview", "COMBO", "live preview while tokens are committed: the partial image, the partial image "
               "tinted by acceptance (longer accepted runs brighter), or off", default="image",
               options=PREVIEW_MODES),
        # new inputs go last, optional: prompts and workflows saved before them keep working
        Widget("compare_with_ar", "BOOLEAN", "also run plain AR with the same model, prompt, seed, batch and guidance "
               "in this execution, and show the wall-clock speed-up against it (costs one AR generation)",
               default=False, optional=True),
        Widget("compile", "BOOLEAN", "run the whole decode step (drafting, the model's forward, verification) through torch.compile "
               "(one static graph per step shape, kept for later runs with the same shapes): the same sampler (the tokens are eager's unless float rounding "
               "decides a sampling race, which is rare), a faster step where per-step overhead dominates (small models, "
               "CPU). The first run with a new backend, size, batch or guidance compiles "
               "first (seconds to minutes, counted in that run's time; a cache on disk shortens it in later "
               "sessions); where compiling is not possible it says so once and runs eager. compare_with_ar's AR "
               "run stays eager", default=False, optional=True),
        Widget("same_image_as_ar", "BOOLEAN", "on: every lossless backend gives exactly plain AR's image for the seed "
               "(a draft is kept only where it is the token AR samples there, with the seed's noise for that image "
               "and position), so a seed found with one backend renders the same with any other, on any machine; "
               "backends differ only in speed. off: each backend samples AR's distribution with its own random "
               "draws (the same seed gives different images on different backends). Lossy settings (relaxed) "
               "need it off. With it on, SCD's coupling has no effect (SCD samples as SJD)",
               default=REPRODUCIBLE_DEFAULT, optional=True),
        Widget("reference_images", "IMAGE", "image-to-image (GLM-Image): one or two reference images (a batch of "
               "two, e.g. from Image Batch) to edit or follow; the prompt says what to do with them. Other models "
               "refuse it", optional=True),
    ]
    return NodeSpec(
        node_id="SpecARSampler",
        display_name="SpecAR Sampler",
        description=("Generate an image with lossless speculative decoding: every backend samples exactly what "
                     "plain AR sampling does, in fewer forward passes. Shows the measured latency and, with "
                     "compare_with_ar on, the speed-up over an AR run measured in the same execution."),
        inputs=inputs,
        outputs=[
            Output("image", "IMAGE", "the generated images [B,H,W,C]"),
            Output("tokens", TOKENS_TYPE, "the image tokens, for SpecAR Decode Tokens or later nodes"),
            Output("stats", "STRING", "generation statistics as JSON: forward passes, step compression, latency, "
                   "accepted lengths"),
            Output("acceptance_heatmap", "IMAGE", "per token: how many tokens the step that committed it accepted "
                   "(dark: one, yellow: the longest accepted runs)"),
        ],
        output_node=True,
    )


def decode_spec() -> NodeSpec:
    return NodeSpec(
        node_id="SpecARDecode",
        display_name="SpecAR Decode Tokens",
        description="Decode SpecAR image tokens to an image with the model's own image decoder (VQ).",
        inputs=[Widget("tokens", TOKENS_TYPE, "the tokens output of a SpecAR Sampler")],
        outputs=[Output("image", "IMAGE", "the decoded images [B,H,W,C]")],
    )
