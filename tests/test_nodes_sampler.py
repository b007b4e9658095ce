"""The sampler and decode nodes: one error per bad value on the right input, limits between inputs,
compare_with_ar, lossy runs, out of memory, cancellation, batches, custom top-k, the compile input.
The nodes run without ComfyUI: stand-ins from tests/support/comfy_stubs.py through the `comfy` fixture (tests/conftest.py).
"""
import dataclasses
import json

import pytest
import torch

import specar
from specar.nodes import core, models, report, v1
from support.node_harness import (
    stubs, flavours, node_classes, is_dynamic, as_comfy_passes, execute,
    sampler_values, api_inputs, dynamic_name, run_sampler_node, BASE, BACKEND_CHOICES, queue_errors)


@pytest.mark.parametrize("flavour", flavours())
@pytest.mark.parametrize("change, bad_input, message", [
    ({"backend": "turbo"}, "backend", f"backend must be one of {BACKEND_CHOICES}; got 'turbo'"),
    ({"sjd_init": "diagonal"}, "sjd_init", "sjd_init must be one of random, repeat_left"),
    ({"backend": "scd", "scd_coupling": "strong"}, "scd_coupling", "scd_coupling must be one of maximal, gumbel"),
    ({"sjd_window": 999}, "sjd_window", "sjd_window must be an int in [1, 128], got 999"),
    ({"seed": -1}, "seed", "seed must be an int in [0, 18446744073709551615], got -1"),
    ({"sampling": "custom", "top_p": 0.0}, "top_p", "top_p must be a number in (0, 1] (1.0 = no top-p), got 0.0"),
    ({"sampling": "custom", "temperature": float("nan")}, "temperature",
     "temperature must be a finite number >= 0 (0 = greedy), got nan"),
    ({"sampling": "sometimes"}, "sampling", "sampling must be one of model default, custom"),
    # an on/off input: ComfyUI runs bool(value), so it files nothing itself; the prompt guard refuses it when
    # queued, filed under that input (the validate function names it for this prompt: ComfyUI files its verdict
    # under each input it names), or, nested in a DynamicCombo (no name a function can take), under the one input
    # the validate function takes; the node refuses what reaches it unconverted
    ({"backend": "sjd_pac", "sjd_pac_continuation": "yes"}, "sjd_pac_continuation",
     "sjd_pac_continuation must be true or false"),
    ({"guidance": "custom", "cfg_scale": -1.0}, "cfg_scale",
     "cfg_scale must be a finite number >= 0 (1.0 = no guidance), got -1.0"),
    ({"guidance": "always"}, "guidance", "guidance must be one of model default, custom"),
    ({"backend": "hawk", "hawk_heads": "elsewhere"}, "hawk_heads", "hawk_heads must be one of (beside the model)"),
    # limits between inputs: not a widget range, so ComfyUI files nothing; the node says it once, when it runs
    ({"backend": "sjd_pac", "sjd_pac_window": 4, "sjd_pac_tree_depth": 5}, None,
     "tree_depth must be an int in [1, 4], got 5"),
])
def test_bad_values_give_one_error_on_the_right_input(flavour, change, bad_input, message, comfy):
    classes = node_classes(flavour)
    sampler, loader = classes["SpecARSampler"], classes["SpecARModelLoader"]
    values = {**BASE, **change}
    validate_input = "unique_id" if flavour == "v1" else "model"  # the one input the validate function takes
    if is_dynamic(sampler):
        message = message.replace(f"{values['backend']}_", "", 1)  # nested inputs keep their own names
    if is_dynamic(sampler) and bad_input:
        bad_input = dynamic_name(bad_input, values["backend"])
        bad_input = validate_input if bad_input == "backend.continuation" else bad_input
        # ComfyUI drops a switch whose value is none of its options: the prompt guard refuses it (and the node,
        # which never sees the value, says "none" when it runs)
        message = message.split("; got")[0] if bad_input in ("backend", "guidance", "sampling") else message
        bad_input = validate_input if bad_input in ("backend", "guidance", "sampling") else bad_input

    def prompt(values):
        return {"1": {"class_type": "SpecARModelLoader", "inputs": {"model": "demo", "device": "auto", "dtype": "auto"}},
                "10": {"class_type": "SpecARSampler", "inputs": {"model": ["1", 0], **api_inputs(sampler, values)}}}
    errors = queue_errors(prompt(values), classes)
    assert {nid: bad for nid, (bad, _) in errors.items()} == ({"10": [bad_input]} if bad_input else {})
    model, = execute(loader, model="demo", device="auto", dtype="auto")[0]
    with pytest.raises(ValueError) as e:
        run_sampler_node(sampler, model, values)
    assert message in str(e.value)
    assert queue_errors(prompt(BASE), classes) == {}
    core.backend_config(BASE)  # valid: no ValueError
    # the inputs of backends not chosen are not the node's concern when it runs
    core.backend_config({**BASE, "backend": "ar", "sjd_pac_tree_depth": 100})


@pytest.mark.parametrize("flavour", flavours())
def test_on_off_inputs_refuse_other_values_when_queued(flavour, comfy):
    """ComfyUI's own validation runs bool(value) on an on/off input ("false" would run as on): the prompt as
    posted is checked (nodes/prompt_guard.py, an on-prompt handler) and the node refuses it when queued."""
    classes = node_classes(flavour)
    sampler = classes["SpecARSampler"]

    def prompt(**change):
        return {"1": {"class_type": "SpecARModelLoader", "inputs": {"model": "demo", "device": "auto", "dtype": "auto"}},
                "10": {"class_type": "SpecARSampler",
                       "inputs": {"model": ["1", 0], **api_inputs(sampler, sampler_values(backend="sjd_pac", **change))}}}

    assert queue_errors(prompt(), classes) == {}
    for change, name in (({"compile": "false"}, "compile"), ({"same_image_as_ar": 0}, "same_image_as_ar"),
                         ({"sjd_pac_continuation": "no"}, dynamic_name("sjd_pac_continuation", "sjd_pac")
                          if is_dynamic(sampler) else "sjd_pac_continuation")):
        errors = queue_errors(prompt(**change), classes)
        assert list(errors) == ["10"], change
        bad, messages = errors["10"]
        # once, under the input itself (planted: under the validate function's one input, unique_id / model),
        # or under model where it is nested in a DynamicCombo (no name a function can take)
        assert bad == ["model" if "." in name else name]
        value = next(iter(change.values()))
        assert messages == [f"{name} must be true or false, got {value!r} (ComfyUI would run any other value as on)"]
    assert queue_errors(prompt(compile=True), classes) == {}  # a later good prompt for the same node passes
    if flavour == "v1":  # ComfyUI passes the hidden id to the node's function too
        model, = execute(classes["SpecARModelLoader"], model="demo", device="auto", dtype="auto")[0]
        execute(sampler, model=model, unique_id="10", **BASE)


def test_a_tree_too_big_for_the_model_names_its_parameters(comfy):
    model, = execute(v1.SpecARModelLoader, model="demo", device="auto", dtype="auto")[0]
    limit = models.resolve(model).max_positions
    assert limit is not None
    values = sampler_values(backend="hawk", hawk_node_budget=min(512, limit + 8))
    with pytest.raises(ValueError) as e:
        execute(v1.SpecARSampler, model=model, **values)
    assert "node_budget=" in str(e.value) and "allows at most" in str(e.value) and "lower" in str(e.value)


def test_speedup_is_measured_against_ar_in_the_same_execution(comfy):
    model, = execute(v1.SpecARModelLoader, model="demo", device="auto", dtype="auto")[0]
    _, ui = execute(v1.SpecARSampler, model=model, **sampler_values(backend="ar"))
    assert ui["text"][0].startswith("AR (baseline): 16 tokens in 16 forward passes")
    # an AR run of an earlier execution is never the reference: no speed-up without compare_with_ar
    _, ui = execute(v1.SpecARSampler, model=model, **sampler_values(backend="sjd_pac"))
    assert ui["text"][0].startswith("SJD-PAC: 16 tokens in ") and "turn on compare_with_ar" in ui["text"][0]
    assert "speedup_vs_ar" not in json.loads(ui["specar_stats"][0])
    calls = []
    real_generate = core.generate

    def recording_generate(model, prompt, backend="sjd", **kw):
        # the node passes its validated BackendConfig (the compare run: the name "ar")
        calls.append((getattr(backend, "name", backend), kw["seed"], kw["batch_size"], kw["sampling"].cfg_scale,
                      kw["sampling"].top_k))
        return real_generate(model, prompt, backend=backend, **kw)

    core.generate = recording_generate
    try:
        _, ui = execute(v1.SpecARSampler, model=model, **sampler_values(backend="sjd_pac", batch_size=2, seed=5,
                                                                        compare_with_ar=True))
    finally:
        core.generate = real_generate
    assert [c[0] for c in calls] == ["sjd_pac", "ar"] and calls[0][1:] == calls[1][1:] == (5, 2, None, None)
    s = json.loads(ui["specar_stats"][0])
    assert f"{s['ar_latency_s'] / s['latency_s']:.2f}x AR's {s['ar_latency_s']:.2f} s measured in this run" in ui["text"][0]
    assert abs(s["speedup_vs_ar"] - s["ar_latency_s"] / s["latency_s"]) < 1e-9
    # batch 2: tokens and forward passes summed over the images, the ratio of the sums
    tokens, forwards = 2 * 16, sum(n + 1 for n in s["steps"])
    assert (s["tokens_total"], s["forwards_total"]) == (tokens, forwards)
    assert f"2 images, {tokens} tokens in {forwards} forward passes summed over the images " \
           f"({tokens / forwards:.1f}x fewer than AR)" in ui["text"][0]


def test_a_lossy_run_says_so_and_is_never_called_faster():
    from specar.samplers.stats import GenerationStats
    fields = {f: None for f in GenerationStats.__dataclass_fields__}
    base = dict(fields, backend="adt_tree", batch=1, image_tokens=16, nfe=3, steps=[3], latency_s=0.1, lossy=True,
                params={}, accepted_length_histogram={})
    lossy = GenerationStats(**base)
    ar = GenerationStats(**dict(base, backend="ar", nfe=15, steps=[15], latency_s=1.0, lossy=False))
    line, notes = report.summary(lossy, ar)
    assert "LOSSY" in line.split(":")[0] and "same image as AR" not in line
    assert "faster" not in " ".join(notes) and "not comparable" in " ".join(notes)
    line, notes = report.summary(GenerationStats(**dict(base, lossy=False)), ar)
    assert "speed-up: faster" in notes


def test_out_of_memory_names_what_to_lower_and_leaves_the_model_usable(comfy, monkeypatch):
    handle, = execute(v1.SpecARModelLoader, model="demo", device="auto", dtype="auto")[0]
    model = models.resolve(handle)
    values = sampler_values(backend="sjd_pac", sjd_pac_window=8, batch_size=3, seed=1)
    reference = execute(v1.SpecARSampler, model=handle, **values)[0]
    real_forward = type(model).forward

    def oom(self, *a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(type(model), "forward", oom)
    with pytest.raises(RuntimeError) as e:
        execute(v1.SpecARSampler, model=handle, **values)
    msg = str(e.value)
    assert "out of GPU memory" in msg and "batch_size (now 3)" in msg and "window=8" in msg and "still loaded" in msg
    monkeypatch.setattr(type(model), "forward", real_forward)
    again = execute(v1.SpecARSampler, model=handle, **values)[0]
    assert torch.equal(again[1]["tokens"], reference[1]["tokens"])


@pytest.mark.parametrize("flavour", flavours())
@pytest.mark.parametrize("where", ["progress_hook", "interrupt_check"])
def test_cancel_stops_generation_and_model_stays_usable(flavour, where, comfy):
    classes = node_classes(flavour)
    sampler = classes["SpecARSampler"]
    model, = execute(classes["SpecARModelLoader"], model="demo", device="auto", dtype="auto")[0]
    args = {**BASE, "backend": "sjd_pac", "sjd_pac_window": 4, "sjd_pac_tree_depth": 2, "seed": 3}
    reference = execute(sampler, model=model, **args)[0]
    comfy["progress"].clear()
    comfy["interrupt"] = True
    comfy["interrupt_in_progress_hook"] = where == "progress_hook"
    with pytest.raises(stubs.InterruptProcessingException):
        execute(sampler, model=model, **args)
    assert len(comfy["progress"]) == 1  # stopped after the first step
    assert comfy["interrupt"] is False  # the flag is consumed, as ComfyUI's own check does
    again = execute(sampler, model=model, **args)[0]
    assert torch.equal(again[1]["tokens"], reference[1]["tokens"])
    assert json.loads(again[2])["nfe"] == json.loads(reference[2])["nfe"]


@pytest.mark.parametrize("flavour", flavours())
def test_decode_node(flavour, comfy):
    classes = node_classes(flavour)
    model, = execute(classes["SpecARModelLoader"], model="demo", device="auto", dtype="auto")[0]
    _, tokens, _, _ = execute(classes["SpecARSampler"], model=model, **BASE)[0]
    with pytest.raises(ValueError, match="no image decoder"):  # tiny random models have none
        execute(classes["SpecARDecode"], tokens=tokens)
    with pytest.raises(ValueError, match="tokens output of a SpecAR Sampler"):
        execute(classes["SpecARDecode"], tokens=torch.zeros(4, 4))


def test_heatmap_and_summary():
    img = report.heatmap([[0, 1, 1], [1, 2, 2]], size=(4, 6))
    assert img.shape == (4, 6, 3) and float(img.min()) >= 0 and float(img.max()) <= 1
    flat = report.heatmap([[0, 1], [2, 3]])
    assert torch.allclose(flat, flat[0, 0].expand_as(flat))  # AR: every step one token, one colour


def test_batch_gives_one_image_and_heatmap_per_sample(comfy):
    model, = execute(v1.SpecARModelLoader, model="demo", device="auto", dtype="auto")[0]
    image, tokens, stats, heat = execute(v1.SpecARSampler, model=model, **{**BASE, "batch_size": 3})[0]
    assert image.shape == (3, 4, 4, 3) and heat.shape == (3, 4, 4, 3) and tokens["tokens"].shape == (3, 4, 4)
    assert json.loads(stats)["batch"] == 3


def test_custom_top_k_0_means_all_tokens(comfy, monkeypatch):
    """The tooltip's "0 = all tokens" holds: custom top_k 0 reaches generate as 0 (no top-k), not as
    None, which is the model's recommended top-k (256 on the demo model: what it silently was)."""
    model, = execute(v1.SpecARModelLoader, model="demo", device="auto", dtype="auto")[0]
    seen, real_generate = [], core.generate
    monkeypatch.setattr(core, "generate", lambda *a, **kw: seen.append(kw["sampling"].top_k) or real_generate(*a, **kw))
    values = sampler_values(backend="ar", guidance="custom", cfg_scale=2.0, top_k=0, seed=3)
    _, tokens, stats, _ = execute(v1.SpecARSampler, model=model, **values)[0]
    assert seen == [0]
    assert json.loads(stats)["sampling"]["top_k"] == "off"
    direct = specar.generate(models.resolve(model), "x", backend="ar", seed=3, sampling=dict(cfg_scale=2.0, top_k=0))
    assert torch.equal(tokens["tokens"][0], direct.tokens)


@pytest.mark.parametrize("flavour", flavours())
def test_compile_input_reaches_generate_and_defaults_off(flavour, comfy, monkeypatch):
    """The sampler's compile input is what `generate` gets as its options' compile (False when an API prompt saved
    before the input existed leaves it out); compare_with_ar's AR run stays eager."""
    classes = node_classes(flavour)
    model, = execute(classes["SpecARModelLoader"], model="demo", device="auto", dtype="auto")[0]
    seen, real_generate = [], core.generate

    def recording_generate(model, prompt, backend="sjd", options=None, **kw):
        options = options if isinstance(options, specar.RunOptions) else specar.RunOptions(**options or {})
        seen.append((getattr(backend, "name", backend), options.compile))
        # the compiled step itself: test_compile.py
        return real_generate(model, prompt, backend=backend, options=dataclasses.replace(options, compile=False), **kw)

    monkeypatch.setattr(core, "generate", recording_generate)
    run_sampler_node(classes["SpecARSampler"], model, sampler_values(backend="sjd", compile=True, compare_with_ar=True))
    assert seen == [("sjd", True), ("ar", False)]
    seen.clear()
    cls = classes["SpecARSampler"]
    old = {k: v for k, v in api_inputs(cls, sampler_values(backend="sjd")).items()
           if k not in ("compile", "compare_with_ar")}
    execute(cls, model=model, **as_comfy_passes(cls, old))
    assert seen == [("sjd", False)]
    with pytest.raises(Exception, match="compile must be true or false, got 'yes'"):
        execute(v1.SpecARSampler, model=model, **sampler_values(compile="yes"))


def test_the_summary_line_carries_the_verdict_and_names_eager_ar_for_a_compiled_run():
    from specar.samplers.stats import GenerationStats
    fields = {f: None for f in GenerationStats.__dataclass_fields__}
    base = dict(fields, backend="sjd", batch=1, image_tokens=16, nfe=3, steps=[3], latency_s=1.0, lossy=False,
                reproducible=True, params={}, accepted_length_histogram={})
    ar = GenerationStats(**dict(base, backend="ar", nfe=15, steps=[15], latency_s=1.06))
    line, notes = report.summary(GenerationStats(**base), ar, ratios=[1.06])
    assert "1.06x AR's 1.06 s measured in this run (within timing noise: no verdict yet)" in line
    # a verdict from several runs shows their range, never one ratio beside a verdict it does not support
    line, _ = report.summary(GenerationStats(**base), ar, ratios=[1.2, 1.3, 1.25])
    assert "x AR's 1.06 s measured in this run (faster: 1.20-1.30x over the last 3 runs)" in line
    line, _ = report.summary(GenerationStats(**base), ar, ratios=[2.35, 0.84, 1.06])
    assert "(no clear difference: 0.84-2.35x over the last 3 runs)" in line
    line, _ = report.summary(GenerationStats(**base), ar, first_run=True)
    assert "(no verdict: one-time costs in this run)" in line
    # a compiled run is compared with eager AR (the node's AR run is never compiled): the line says so
    compiled = GenerationStats(**dict(base, compile={"compiles": 0, "graphs_reused": 1, "graphs_used": 1}))
    line, _ = report.summary(compiled, ar, ratios=[1.06])
    assert "1.06x eager (uncompiled) AR's 1.06 s" in line
    fell_back = GenerationStats(**dict(base, compile={"compiles": 0, "eager_fallback": "no compiler"}))
    assert "x AR's 1.06 s" in report.summary(fell_back, ar, ratios=[1.06])[0]


def test_a_loaded_model_says_its_quantization():
    from specar.model_loaders.registry import load_model
    assert load_model("demo").quantization == "none" and load_model("demo", quantize="int4").quantization == "int4"


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_a_quantized_model_is_named_in_the_summary_details_and_statistics(quantize, comfy):
    handle, = execute(v1.SpecARModelLoader, model="demo", device="auto", dtype="auto", quantize=quantize)[0]
    _, ui = execute(v1.SpecARSampler, model=handle, **sampler_values(backend="sjd_pac"))
    s = json.loads(ui["specar_stats"][0])
    assert s["quantization"] == quantize
    if quantize == "none":
        assert ui["text"][0].startswith("SJD-PAC: 16 tokens") and "model)" not in ui["text"][0].split("\n")[0]
    else:
        assert ui["text"][0].startswith("SJD-PAC (int8 model): 16 tokens")
