"""gpu-check's images, quantized and projection stages in their dry run on the CPU: each released model
(tooling/released_models.py) at its real geometry (grid, sequence length, code vocabulary, CFG rows) with tiny widths,
built by its family's classes and loaded through its loader; same-image tokens against AR's in bf16 with the
batch-invariant mode as the product sets it and flipped; ratios kept by a stage cut mid-way; a planted token
difference reported; the default CUDA plan within its budget.

No GPU here: these check the command; its CUDA figures come from a GPU run."""
import pytest
import transformers

from specar.samplers.backends import DEFAULT_BACKEND, SCHEMAS
from specar.tooling import gpu_check
from specar.tooling.gpu_check import images, plan, projection, quantized, report, runner



def options(*argv, dry=True):
    return gpu_check.options_from_argv([*(["--dry-run"] if dry else []), *argv])

# the released models' geometry (their config.json / processor settings; tooling/released_models.py)
GEOMETRY = {"janus-pro-7b": ([24, 24], 576, 16384), "emu3-gen": ([90, 90], 8190, 32768),
            "lumina-mgpt-2-7b": ([96, 96], 9312, 16384), "emu3.5-image": ([64, 64], 4160, 131072)}
HAS_GLM = hasattr(transformers, "GlmImageForConditionalGeneration")
if HAS_GLM:  # GLM-Image at 1024x1024: its 32x32 image grid after its 16x16 preview grid (1,280 positions)
    GEOMETRY["glm-image"] = ([32, 32], 1024, 16384)


def _run(*argv):
    rep = runner.run_check(options("--no-compile", *argv), in_process=True)
    for name, rec in rep["stages"].items():
        assert rec["status"] == "ok", (name, rec["result"].get("error"))
    return rep


@pytest.fixture(scope="module")
def three_families():
    # every released model (the dry run's default families; GLM-Image with AR and the default backend only, as the
    # default run takes it)
    return _run("--stages", "images", "quantized", "projection", "--image-backends", "ar", DEFAULT_BACKEND,
                *([] if HAS_GLM else ["--image-families", *GEOMETRY]))


# the three families' stages at their released geometry (a minute of position noise and forwards on a CPU) and every
# backend at one: make test-long, like the whole dry run (tooling/tests/test_gpu_check.py); make test keeps the checks below
@pytest.mark.long
def test_each_released_model_runs_at_its_real_geometry(three_families):
    fams = three_families["stages"]["images"]["result"]["families"]
    assert list(fams) == list(GEOMETRY)
    for name, fam in fams.items():
        m = fam["model"]
        assert (m["grid"], m["seq_len"], m["image_codes"]) == GEOMETRY[name], name
        assert m["tiny_widths"] and m["layers"] == 2 and m["layers_released"] >= 30
        glm = name == "glm-image"
        # two CFG rows, as the released model's default sampling (GLM-Image's AR stage: none)
        assert fam["sampling"]["cfg_scale"] == 1 if glm else fam["sampling"]["cfg_scale"] > 1
        assert fam["timed"] == f"the first 8 of {m['positions']} positions (dry run)"
        ar, other = fam["rows"]["ar"]["eager"], fam["rows"][DEFAULT_BACKEND]["eager"]
        for run in (ar, other):
            assert run["positions"] == 8 and not run["whole_image"] and run["steps"] >= 1 and run["seconds"] > 0
            assert run["step_ms_median"] > 0 and run["step_ms_p90"] >= run["step_ms_median"]
            assert run["peak_memory_bytes"] is None  # the CPU
            assert run["batch_invariant"]  # bf16 on the CPU: the product's batch-invariant forwards
        assert other["speedup_vs_ar"] == ar["latency_s"] / other["latency_s"]
        # the same-image guarantee measured: the default backend's tokens are AR's
        assert other["vs_ar"] == {"positions_compared": 8, "tokens_differing": 0, "first_difference_at": None}
        if glm:  # the default run's share: AR and the default backend eager, the 8 positions in the preview grid
            assert m["preview_grid"] == [16, 16] and m["positions"] == 1280 and list(fam["rows"]) == ["ar",
                                                                                                   DEFAULT_BACKEND]
            assert "eager_invariant_flipped" not in fam["rows"][DEFAULT_BACKEND] and "only" in fam
            assert list(other["grids"]) == ["preview"] and other["grids"]["preview"]["positions"] == 8
            continue
        flipped = fam["rows"][DEFAULT_BACKEND]["eager_invariant_flipped"]
        assert not flipped["batch_invariant"] and flipped["vs_ar"]["positions_compared"] == 8
        # shape-pinned: the backend at its verify width against AR padded to it, ms per step of both (the dry run: in
        # the first family only)
        if name != "janus-pro-7b":
            assert "eager_pinned" not in fam["rows"][DEFAULT_BACKEND] and not fam.get("ar_pinned")
            continue
        pinned = fam["rows"][DEFAULT_BACKEND]["eager_pinned"]
        assert pinned["pin_width"] > 1 and list(fam["ar_pinned"]) == [str(pinned["pin_width"])]
        assert pinned["vs_ar"]["positions_compared"] == 8 and not pinned["batch_invariant"]
        assert pinned["same_image_guarantee"] == "not_guaranteed"
        assert pinned["same_image_reason"] == "shape-pinned bfloat16 on cpu, not verified there"
        assert pinned["step_ms_median"] > 0 and pinned["ar_step_ms_median"] == \
            fam["ar_pinned"][str(pinned["pin_width"])]["step_ms_median"] > 0
        assert "eager_pinned" not in fam["rows"]["ar"]
    # assumed numbers are said; Emu3-Gen's are all read from its config
    assert fams["emu3-gen"]["model"]["assumed"] is None
    assert fams["janus-pro-7b"]["model"]["assumed"] and fams["lumina-mgpt-2-7b"]["model"]["assumed"]
    assert not HAS_GLM or fams["glm-image"]["model"]["assumed"]


@pytest.mark.long
def test_quantized_and_projection_stages_in_the_dry_run(three_families):
    q = three_families["stages"]["quantized"]["result"]
    assert q["note"] == quantized.NOT_TIMED
    assert {"bf16", "ours int8", "ours int4"} <= set(q["variants"]) and q["rows"] == [1, 2, 17, 34, 66]
    for name, v in q["variants"].items():
        assert list(v["forward_ms"]) == ["1", "2", "17", "34", "66"], name  # matrix rows: AR to window 32, CFG or not
        assert set(v["forward_ms"].values()) == {quantized.NOT_TIMED}, name
        assert v["exactness"]["tokens_differing"] == 0 and v["exactness"]["backend"] == DEFAULT_BACKEND
        assert v["exactness"]["pin_width"] is None and v["exactness_pinned"]["pin_width"] > 1
        assert v["exactness_pinned"]["positions"] == v["exactness"]["positions"]
    assert q["variants"]["ours int4"]["weights_bytes"] < q["variants"]["ours int8"]["weights_bytes"] < \
        q["variants"]["bf16"]["weights_bytes"]
    p = three_families["stages"]["projection"]["result"]
    assert p["kind"] == "projection" and p["rows"] and len(p["anchors"]) == 4
    glm_rows = [r for r in p["rows"] if r.get("family") == "glm-image"]
    assert not HAS_GLM or glm_rows and all("vLLM-Omni" in r["anchor"] and "19.0 s" in r["anchor"] and
                                           r["steps_per_image"] * r["step_compression"] == pytest.approx(1280, rel=1e-3)
                                           for r in glm_rows)  # both grids' codes, beside the published anchor
    for row in p["rows"]:
        assert row["kind"] == "projection" and "error" not in row, row
        # the row's ms are rounded: Emu3.5's 4,096 steps of a slow CPU step carry that rounding past 0.01 s
        assert row["seconds_per_image"] == pytest.approx(row["steps_per_image"] * row["measured_step_ms"] / 1e3,
                                                         rel=1e-4, abs=0.01)
    md = report.markdown(three_families)
    for head in ("## Images at released shapes", "## Quantized weights", "## PROJECTION", "Published anchors"):
        assert head in md


@pytest.mark.long
def test_every_registered_backend_gives_ars_tokens_at_a_released_geometry():
    rep = _run("--stages", "images", "--image-families", "lumina-mgpt-2-7b")
    rows = rep["stages"]["images"]["result"]["families"]["lumina-mgpt-2-7b"]["rows"]
    assert list(rows) == plan.backend_order(plan.committed_reports()) and set(rows) == set(SCHEMAS)
    assert rows["sjd_pac"]["preset"] == gpu_check.PAPER_PRESETS["sjd_pac"]
    for b, row in rows.items():
        if b != "ar" and SCHEMAS[b].lossless:
            assert row["eager"]["vs_ar"]["tokens_differing"] == 0, b


def test_a_planted_token_difference_is_reported(monkeypatch):
    real = images.timed_generation

    def plant(model, prompt, backend, limit, **kw):
        tokens, rec = real(model, prompt, backend, limit, **kw)
        if getattr(backend, "name", backend) == DEFAULT_BACKEND:
            tokens = tokens.clone()
            tokens[5] = (tokens[5] + 1) % model.geometry.vocab_size
        return tokens, rec

    monkeypatch.setattr(images, "timed_generation", plant)
    rep = _run("--stages", "images", "--image-families", "lumina-mgpt-2-7b", "--image-backends", "ar", DEFAULT_BACKEND)
    row = rep["stages"]["images"]["result"]["families"]["lumina-mgpt-2-7b"]["rows"][DEFAULT_BACKEND]
    assert row["eager"]["vs_ar"]["tokens_differing"] == 1 and row["eager"]["vs_ar"]["first_difference_at"] == 5
    assert row["eager_pinned"]["vs_ar"]["tokens_differing"] == 1  # the pinned comparison too
    md = report.markdown(rep)
    assert "1 of 8 differ, first at 5" in md  # 8 positions: the first 8 codes of a 96-code row
    assert f"1 of 8 differ, first at 5 (pinned at {row['eager_pinned']['pin_width']} tokens)" in md
    assert "AR padded to each verify width" in md


def test_an_images_stage_cut_mid_way_keeps_the_ratios_of_its_finished_rows(monkeypatch):
    real, calls = images.timed_generation, []

    def cut(*a, **kw):  # the untimed first generation, AR, AR flipped, one more backend; the 5th call is cut
        calls.append(a[2])
        if len(calls) == 5:
            raise runner.StageTimeout("planted: the stage's budget ends here")
        return real(*a, **kw)

    monkeypatch.setattr(images, "timed_generation", cut)
    rep = runner.run_check(options("--no-compile", "--stages", "images", "--image-families", "lumina-mgpt-2-7b",
                                   "--image-backends", "ar", "sjd", "scd"), in_process=True)
    rec = rep["stages"]["images"]
    assert rec["status"] == "timed out"
    rows = rec["result"]["families"]["lumina-mgpt-2-7b"]["rows"]
    assert rows["sjd"]["eager"]["speedup_vs_ar"] == rows["ar"]["eager"]["latency_s"] / rows["sjd"]["eager"]["latency_s"]
    assert "eager" not in rows.get("scd", {})


def test_the_default_cuda_plan_fits_its_budget_and_takes_backends_from_the_registry():
    opt = options("--plan-only", dry=False)
    p = opt["plan"]
    assert list(p["stages"]) == gpu_check.PROFILES["cuda"]["stages"]
    assert p["predicted_total_s"] is not None and p["predicted_total_s"] <= p["total_budget_s"] <= 560
    for name, st in p["stages"].items():
        assert not st["cut"], (name, st["cut"])
    assert opt["image_backends"] == plan.backend_order(plan.committed_reports())
    items = [i["item"] for i in p["stages"]["images"]["items"]]
    # GLM-Image at 1024x1024 in the default run: AR and the default backend eager, its share said in the plan
    assert opt["image_family_backends"] == {"glm-image": ["ar", DEFAULT_BACKEND]}
    glm = [i for i in items if i.startswith("glm-image")]
    assert len(glm) == 3 and "this run's share: ar and auto eager" in glm[0]
    rows = gpu_check.GLM_DEFAULT_ROWS
    for b, item in zip(["ar", DEFAULT_BACKEND], glm[1:]):
        assert item == f"glm-image: eager {b}, 1024x1024, {16 * rows} of 1280 positions (preview grid first)"
    for fam in [f for f in opt["image_families"] if f not in opt["image_family_backends"]]:
        for b in SCHEMAS:
            assert any(i.startswith(f"{fam}: eager {b},") for i in items), (fam, b)
            assert any(i.startswith(f"{fam}: eager {b} shape-pinned") for i in items) == (b != "ar"), (fam, b)
    # the quantized stage at the verify widths' rows, every library variant listed (run where installed)
    quant = [i["item"] for i in p["stages"]["quantized"]["items"]]
    for name in ("bf16", "ours int4", "torchao int8", "torchao int4 tile_packed_to_4d", "torchao int4 plain",
                 "torchao int4 preshuffled", "bitsandbytes int4"):
        assert any(i.startswith(f"{name}: build, forwards of [1, 2, 17, 34, 66] rows") for i in quant), name
    text = plan.plan_text(p)
    assert "images" in text and "estimated: from the 7B shape's forwards" in text
    # Emu3.5-Image (34 B) past this run's budget: listed with what its own lease runs (its first row of 64 codes)
    emu = [i["item"] for i in p["follow_up"]["emu3.5-image"]["items"]]
    assert "emu3.5-image: eager ar, 65 positions" in emu and not p["follow_up"]["emu3.5-image"]["cut"]
    assert "not in this run, its own lease: --image-families emu3.5-image: images stage" in text


def test_projection_takes_each_backends_row_at_its_defaults_or_paper_preset():
    for path, _ in projection.REGIMES.values():
        comp = projection.regime_compressions(f"{plan.REPO_ROOT}/{path}", gpu_check.PAPER_PRESETS)
        assert comp["ar"] == 1.0 and set(comp) <= set(SCHEMAS) and "sjd_pac" in comp
        assert all(c >= 1.0 for c in comp.values())
    # the same-image regime's rows are all same-image runs, token-identical to AR's
    import json
    with open(f"{plan.REPO_ROOT}/{projection.REGIMES['paper, same image'][0]}") as f:
        rows = json.load(f)["rows"]
    assert all(r["reproducible"] and r["same_tokens_as_ar"] == r["samples"] for r in rows)


@pytest.mark.long
def test_the_compiled_path_at_a_released_geometry():
    """AR compiled (the dry run's compiled backend) on Lumina-mGPT 2.0's native classes in bf16 with the batch-invariant
    mode traced: no recompile, no graph break, no re-recording in the timed run, AR's eager tokens (about 30 s: one
    compile on the CPU)."""
    rep = runner.run_check(options("--stages", "images", "--image-families", "lumina-mgpt-2-7b", "--image-backends",
                                   "ar"), in_process=True)
    c = rep["stages"]["images"]["result"]["families"]["lumina-mgpt-2-7b"]["rows"]["ar"]["compiled"]
    assert "error" not in c and "skipped" not in c, c
    if c["eager_fallback"]:
        pytest.skip(f"no compiler here: {c['eager_fallback']}")
    assert c["compile_s"] > 0 and c["recompiles"] == 0 and c["graph_breaks"] == 0
    assert c["rerecords"] == 0 and c["cudagraph_skips"] == 0 and c["batch_invariant"]
    assert c["vs_ar"]["tokens_differing"] == 0 and c["speedup_vs_ar"] > 0


def test_saved_weights_are_read_back_by_each_family_loader(tmp_path):
    """`--image-weights saved`: random weights written in each family's file format and loaded as a real checkpoint
    (no weight reader replaced), at the released geometry with tiny widths."""
    import os

    import torch

    from specar.tooling.released_models import build_released
    for name, (grid, seq_len, codes) in GEOMETRY.items():
        model, info = build_released(name, str(tmp_path), "cpu", torch.bfloat16, tiny=True, saved=True)
        assert info["weights"].startswith("random, saved") and (info["grid"], info["seq_len"]) == (grid, seq_len)
        assert any(f.endswith(".safetensors") for f in os.listdir(tmp_path / name))


@pytest.mark.skipif(not HAS_GLM, reason="this transformers has no GLM-Image")
def test_a_two_grid_generation_is_timed_over_both_grids_with_generates_tokens(tmp_path):
    """GLM-Image (real-size's reduced folder: a 16x16 preview grid, then a 2x2 image grid): the timed codes are
    `generate`'s (preview then image, same seeds), each grid's record kept, a cut inside the image grid keeps the
    whole preview and the image's first codes."""
    import torch

    import specar
    from specar.tooling.gpu_check.timed_generation import timed_generation
    from specar.tooling.real_size_builders import build_folder
    folder = build_folder("glm-image", str(tmp_path), layers=1, reduced=True, dtype=torch.float32)
    model = specar.load_model(folder, device="cpu", dtype=torch.float32, width=64, height=64)
    res = specar.generate(model, "a red fox", backend="ar", seed=3)
    want = torch.cat([res.preceding.tokens.flatten(), res.tokens.flatten()])
    for backend in ("ar", DEFAULT_BACKEND):
        tokens, rec = timed_generation(model, "a red fox", backend, None, seed=3)
        assert torch.equal(tokens, want), backend
        assert rec["positions"] == 260 and rec["whole_image"] and list(rec["grids"]) == ["preview", "target"]
        assert [g["positions"] for g in rec["grids"].values()] == [256, 4]
        assert rec["seconds"] == round(sum(g["seconds"] for g in rec["grids"].values()), 4)
        assert rec["steps"] >= 2 and rec["step_ms_median"] > 0
    tokens, rec = timed_generation(model, "a red fox", "ar", 258, seed=3)
    assert torch.equal(tokens, want[:258]) and rec["positions"] == 258 and not rec["whole_image"]
    assert rec["grids"]["target"]["positions"] == 2 and not rec["grids"]["target"]["whole_image"]
