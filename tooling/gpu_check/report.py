"""gpu-check's report as markdown: a status row per stage (seconds against its budget and the plan's
prediction), then each stage's table, the errors' last frames and what torch logged. A partial report
(a stage still running, or cut) gives the tables of what it has."""
from __future__ import annotations

import json


def _fmt(x, spec=".3g", none="-"):
    if x is None:
        return none
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int, float)):
        return format(x, spec)
    return str(x)


def _mib(x):
    return "-" if x is None else f"{x / 2**20:,.0f} MiB"


def markdown(report: dict) -> str:
    m, st = report["meta"], report["stages"]
    env = st.get("environment", {}).get("result", {})
    head = "GPU check" + (" (DRY RUN on the CPU: tiny shapes, no GPU figure)" if m["dry_run"] else "")
    lines = [f"# {head}", "", f"`{m['command']}`, {m['date']}, {m['wall_s']} s, device {m['device']}"
             f" ({env.get('device_name', '?')}), torch {env.get('torch', '?')}", "",
             "| stage | status | seconds | budget s | predicted s | peak device memory | peak host RSS | error |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    predicted = {n: p.get("predicted_s") for n, p in ((report.get("plan") or {}).get("stages") or {}).items()}
    rows = [(name, rec) for name, rec in st.items()]
    rows += [(f"{name} (rerun, CUDA_LAUNCH_BLOCKING=1)", rec["blocking_rerun"]) for name, rec in st.items()
             if rec.get("blocking_rerun")]
    for name, rec in rows:
        err = rec.get("result", {}).get("error") or {}
        err_text = f"{err.get('type', '')}: {err.get('message', '')}".strip(": ").splitlines()[0][:120] if err else ""
        if rec.get("reason"):
            err_text = rec["reason"]
        lines.append(f"| {name} | {rec['status']} | {_fmt(rec.get('seconds'))} | {_fmt(rec.get('budget_s'))} | "
                     f"{_fmt(predicted.get(name), '.0f')} | {_mib(rec.get('peak_memory_bytes'))} | {_mib(rec.get('peak_host_rss_bytes'))} | "
                     f"{err_text.replace('|', '/')} |")
    for name, fn in (("environment", _md_environment), ("exactness", _md_exactness), ("images", _md_images),
                     ("quantized", _md_quantized), ("backends", _md_backends), ("forward_7b", _md_forward),
                     ("projection", _md_projection)):
        if name in st and st[name].get("result"):
            try:
                lines += [""] + fn(st[name]["result"])
            except Exception as e:  # noqa: BLE001 -- a partial record must not lose the report
                lines += ["", f"({name}: table not written: {type(e).__name__}: {e})"]
    failed = [(n, rec["result"]["error"]) for n, rec in rows if (rec.get("result") or {}).get("error")]
    if failed:
        lines += ["", "## Errors (the last frames of each traceback)", ""]
        for n, err in failed:
            lines += [f"{n}: {err.get('type')}: {str(err.get('message', '')).strip()[:600]}", "```"]
            lines += err.get("traceback") or ["(no traceback: the process ended without one)"]
            lines += ["```", ""]
    logs = [(n, x) for n, rec in st.items() for x in rec.get("torch_log", [])]
    if logs:
        lines += ["", "## What torch logged (graph breaks, recompiles, CUDA graphs, perf hints)", ""]
        lines += [f"- {n}: {x['message'].splitlines()[0][:200]} (x{x['count']})" for n, x in logs[:60]]
    return "\n".join(lines) + "\n"


def _md_environment(r: dict) -> list:
    keys = ["python", "torch", "torch_cuda", "cudnn", "cuda_driver_api", "nvidia_smi", "transformers", "triton", "device_name",
            "capability", "memory_bytes", "multiprocessors", "bf16_supported", "dynamo_supported", "compile_config"]
    lines = ["## Environment", "", "| item | value |", "| --- | --- |"]
    lines += [f"| {k} | {_fmt(r[k])} |" for k in keys if k in r]
    smoke = r.get("compile_smoke", {})
    lines.append(f"| compile smoke test | {_fmt(smoke.get('ok'))} {smoke.get('error', '')}"
                 f"{' ' + str(smoke.get('seconds')) + ' s' if 'seconds' in smoke else ''} |")
    for variant, v in (r.get("cudagraph_probe") or {}).items():
        text = v.get("error") or (f"CUDA graphs skipped {v['cudagraph_skips']} time(s), results equal to eager: "
                                  f"{_fmt(v['results_equal_eager'])}, {v['seconds']} s")
        lines.append(f"| cache-writing step, reduce-overhead, {variant} | {text.replace('|', '/')} |")
    pk = r.get("peaks", {})
    if pk:
        lines.append(f"| measured copy bandwidth | {pk['copy_bytes_per_s'] / 1e9:,.0f} GB/s (read + write) |")
        lines.append(f"| measured {pk['matmul_dtype']} matrix product | {pk['matmul_flops_per_s'] / 1e12:,.3g} TFLOP/s "
                     f"({pk['matmul_size']}^3) |")
    for k, v in (r.get("sdpa") or {}).items():
        lines.append(f"| SDPA {k} | {json.dumps(v)[:200].replace('|', '/')} |")
    return lines


def _md_exactness(r: dict) -> list:
    lines = [f"## Exactness on {r.get('device')} ({r.get('samples')} images per case, fails at p < "
             f"{r.get('p_fail')})", "", "| backend | params | model | setting | p-value | TV | compression | passed |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in r.get("cases", []):
        if "skipped" in c or "error" in c:
            lines.append(f"| {c['backend']} | | | | {c.get('skipped') or c.get('error')} | | | {_fmt(c.get('passed'))} |")
            continue
        lines.append(f"| {c['backend']} | {json.dumps(c['params'])} | {c['model']} | {c['setting']} | "
                     f"{c['p_value']:.3g} | {c['total_variation']:.4f} | {c['step_compression']:.2f} | "
                     f"{_fmt(c['passed'])} |")
    pl = r.get("planted_wrong_residual")
    if pl:
        lines += ["", f"Planted bug (wrong residual, sjd): p = {_fmt(pl.get('p_value'))}, caught: "
                      f"{_fmt(pl.get('caught'))} {pl.get('error', '')}"]
    lines.append(f"All passed: {_fmt(r.get('all_passed'))}")
    return lines


def _md_backends(r: dict) -> list:
    lines = [f"## Backends on {r.get('model')} ({r.get('dtype')}, {r.get('device')}, one run each)", "",
             "| backend | eager s | eager x AR | forwards | compression | compiled s | compiled x AR | x eager | "
             "compile s | graphs | recompiles | breaks | cudagraph skips | re-recordings, 2nd generation | "
             "buffers rehomed, 2nd generation | tokens = eager |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for b, row in r.get("rows", {}).items():
        e, c = row.get("eager", {}), row.get("compiled", {})
        if c.get("error") or c.get("skipped"):
            c_cells = [c.get("error") or c.get("skipped")] + [""] * 10
        elif c:
            same = c.get("tokens_equal_eager")
            same_text = ("not compared (adaptive: its steps follow its timings)" if not c.get("tokens_compared", True) else
                         _fmt(same) + ("" if same or same is None else
                                       f" ({c.get('tokens_differing')} differ, the first at token "
                                       f"{c.get('first_difference_at')})"))
            skips = c.get("counters", {}).get("inductor", {}).get("cudagraph_skips", 0)
            c_cells = [_fmt(c.get("latency_s")), _fmt(c.get("speedup_vs_ar"), ".2f"), _fmt(c.get("speedup_vs_eager"), ".2f"),
                       _fmt(c.get("compile_s")), _fmt(c.get("compiles")), _fmt(c.get("recompiles")),
                       _fmt(c.get("graph_breaks")), _fmt(skips), _fmt(c.get("rerecords_replay")),
                       _fmt(c.get("buffers_rehomed")),
                       same_text + (f"; EAGER FALLBACK: {c['eager_fallback']}" if c.get("eager_fallback") else "")]
        else:
            c_cells = ["not compiled"] + [""] * 10
        e_cells = ([e.get("error") or e.get("skipped"), "", "", ""] if (e.get("error") or e.get("skipped")) else
                   [_fmt(e.get("latency_s")), _fmt(e.get("speedup_vs_ar"), ".2f"), _fmt(e.get("forwards")),
                    _fmt(e.get("step_compression"), ".2f")])
        lines.append("| " + " | ".join([b] + [str(x).replace("|", "/") for x in e_cells + c_cells]) + " |")
    return lines


def _forwards_kind(x: dict) -> str:
    if x.get("batch_invariant"):
        return "batch-invariant"
    return f"pinned at {x['pin_width']} tokens" if x.get("pin_width") else "plain"


def _run_cells(x: dict, compiled: bool = False) -> list:
    """An images-stage run: seconds, x AR, ms per step (median, p90), steps, peak memory, tokens vs AR's; compiled:
    compile s and what happened inside the timed run."""
    if not x or x.get("error") or x.get("skipped"):
        return [str((x or {}).get("error") or (x or {}).get("skipped") or "not run")] + [""] * (9 if compiled else 6)
    vs = x.get("vs_ar")
    diff = "(AR)" if vs is None else ("same" if vs["tokens_differing"] == 0 else
                                      f"{vs['tokens_differing']} of {vs['positions_compared']} differ, first at "
                                      f"{vs['first_difference_at']}")
    cells = [_fmt(x.get("seconds")), _fmt(x.get("speedup_vs_ar"), ".2f"), _fmt(x.get("step_ms_median"), ".1f") + " / "
             + _fmt(x.get("step_ms_p90"), ".1f"), _fmt(x.get("steps")), _mib(x.get("peak_memory_bytes")),
             f"{diff} ({_forwards_kind(x)})", _fmt(x.get("positions"))]
    if compiled:
        cells += [_fmt(x.get("compile_s")), f"{_fmt(x.get('recompiles'))} / {_fmt(x.get('graph_breaks'))}",
                  f"{_fmt(x.get('rerecords'))} / {_fmt(x.get('cudagraph_skips'))}"
                  + (f"; EAGER FALLBACK: {x['eager_fallback']}" if x.get("eager_fallback") else "")]
    return cells


def _md_images(r: dict) -> list:
    lines = [f"## Images at released shapes ({r.get('dtype')}, {r.get('device')}, random weights)"]
    head = "| backend | mode | s | x AR | ms/step median / p90 | steps | peak memory | tokens vs AR | positions |"
    for name, fam in (r.get("families") or {}).items():
        m = fam.get("model") or {}
        lines += ["", f"### {name} ({m.get('checkpoint', '?')}): {fam.get('timed', '')}"]
        if fam.get("error") or fam.get("skipped"):
            lines.append(f"not measured: {fam.get('error') or fam.get('skipped')}")
            continue
        lines += [f"{m.get('layers')} layers, hidden {m.get('hidden')}, {m.get('heads')} heads / {m.get('kv_heads')} KV, "
                  f"grid {m.get('grid')}"
                  + (f" after a preview grid {m['preview_grid']}" if m.get("preview_grid") else "")
                  + f", {m.get('image_codes')} codes, {m.get('parameters', 0) / 1e9:.2f} B parameters"
                  + (f"; assumed: {m['assumed']}" if m.get("assumed") else "")
                  + (f"; this run: {fam['only']}" if fam.get("only") else ""), "",
                  head + " compile s | recompiles / breaks | re-recordings / cudagraph skips |",
                  "| --- " * 12 + "|"]
        for b, row in (fam.get("rows") or {}).items():
            label = b + (f" ({row['preset']})" if row.get("preset", "default") != "default" else "")
            for mode in ("eager", "eager_invariant_flipped", "eager_pinned", "compiled"):
                if mode in row:
                    cells = _run_cells(row[mode], compiled=mode == "compiled") + ([] if mode == "compiled" else
                                                                                  ["", "", ""])
                    lines.append("| " + " | ".join([label, mode.replace("_", " ")] + [str(c).replace("|", "/")
                                                                                      for c in cells]) + " |")
        grids = [f"{b} {g}: {_fmt(x.get('seconds'))} s over {x.get('positions')} positions, "
                 f"{_fmt(x.get('step_ms_median'), '.1f')} ms/step median"
                 for b, row in (fam.get("rows") or {}).items() for g, x in ((row.get("eager") or {}).get("grids") or
                                                                             {}).items()]
        if grids:  # a two-grid model (GLM-Image): each grid of the eager runs (the second includes its prefill)
            lines += ["", "per grid (eager): " + "; ".join(grids)]
        if fam.get("ar_pinned"):  # what pinning costs AR: its runs padded to each backend's verify width
            lines += ["", "AR padded to each verify width (eager pinned rows' reference), ms/step median: " + ", ".join(
                f"{w} tokens: {_fmt(x.get('step_ms_median'), '.1f') if isinstance(x, dict) else x}"
                for w, x in fam["ar_pinned"].items())]
    return lines


def _md_quantized(r: dict) -> list:
    lines = [f"## Quantized weights ({r.get('shape', {}).get('name')}, {r.get('device')}, 2 CFG rows)"
             + (f": {r['note']}" if r.get("note") else ""), "",
             "libraries: " + ", ".join(f"{k} {v or 'not installed'}" for k, v in (r.get("libraries") or {}).items()),
             "", "| weights | weights MiB | forward ms (tokens: ms) | x bf16 | peak memory | exactness case |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, v in (r.get("variants") or {}).items():
        if v.get("error") or v.get("skipped"):
            lines.append(f"| {name} | {v.get('error') or v.get('skipped')} | | | | |")
            continue
        fw = ", ".join(f"{T}: {_fmt(ms, '.2f')}" for T, ms in (v.get("forward_ms") or {}).items())
        ratio = ", ".join(f"{T}: {x:.2f}" for T, x in (v.get("forward_vs_bf16") or {}).items()) or "-"
        ex = v.get("exactness") or {}
        same = "same tokens" if ex.get("tokens_differing") == 0 else \
            f"{ex.get('tokens_differing')} differ, first at {ex.get('first_difference_at')}"
        lines.append(f"| {name} | {_mib(v.get('weights_bytes'))} | {fw} | {ratio} | {_mib(v.get('peak_memory_bytes'))} | "
                     f"AR vs {ex.get('backend')}, {ex.get('positions')} positions: {same} "
                     f"({ex.get('same_image_guarantee')}) |")
    return lines


def _md_projection(r: dict) -> list:
    lines = ["## PROJECTION: a whole image from measured step costs x committed step counts", "", r.get("note", ""),
             "", "| family | regime | backend | mode | ms/step (measured) | compression (regime) | steps | s / image "
             "(projection) | x AR |", "| --- " * 9 + "|"]
    for x in r.get("rows") or []:
        if x.get("error"):
            lines.append(f"| {x.get('regime')} | {x['error']} |" + " |" * 7)
            continue
        lines.append(f"| {x['family']} | {x['regime']} | {x['backend']} | {x['mode']} | {x['measured_step_ms']:.1f} | "
                     f"{x['step_compression']:.2f} | {x['steps_per_image']} | {x['seconds_per_image']} | "
                     f"{_fmt(x.get('speedup_vs_ar'), '.2f')} |")
    lines += ["", "Published anchors (not measured here):"]
    lines += [f"- {a['what']}: {a['value']} on an {a['device']} ({a['source']})" for a in r.get("anchors") or []]
    return lines


def _undetermined(fit: dict, name: str) -> str:
    return "" if fit.get(f"{name}_identified", True) else " (not determined by the fit: the assumed value kept)"


def _md_forward(r: dict) -> list:
    shape = r.get("shape", {})
    lines = [f"## Forward latency: {shape.get('name')} (hidden {shape.get('hidden_size')}, {shape.get('num_layers')} "
             f"layers, vocabulary {shape.get('vocab_size')}), {r.get('dtype')}, 2 CFG rows, KV slots "
             f"{r.get('kv_slots')}, {r.get('repeats')} timed forwards each", ""]
    fit = r.get("roofline_refit", {})
    rows = {f["tokens"]: f for f in fit.get("forwards", [])}
    tokens = sorted({int(t) for t in list(r.get("eager", {})) + list(r.get("compiled", {})) if t.isdigit()})
    lines += ["| tokens | eager ms | compiled ms | compile s | roofline ms (refit) | eager model ms (refit) |",
              "| --- | --- | --- | --- | --- | --- |"]
    for T in tokens:
        e, c, f = r.get("eager", {}).get(str(T), {}), r.get("compiled", {}).get(str(T), {}), rows.get(T, {})
        cell = lambda d: _fmt(d.get("forward_ms"), ".2f") if "forward_ms" in d else (d.get("error") or d.get("skipped") or "-")  # noqa: E731
        lines.append(f"| {T} | {cell(e)} | {cell(c)} | {_fmt(c.get('first_call_s'), '.1f')} | "
                     f"{_fmt(f.get('roofline_ms'), '.2f')} | {_fmt(f.get('eager_model_ms'), '.2f')} |")
    for mode in ("eager", "compiled"):
        if r.get(mode, {}).get("error"):
            lines.append(f"\n{mode}: {r[mode]['error']}")
    if fit.get("error"):
        return lines + ["", f"Roofline refit: {fit['error']}"]
    if not fit:
        return lines
    cf, ef = fit.get("compiled_fit", {}), fit.get("eager_fit", {})
    lines += ["", f"Roofline refit (tooling/roofline.py's model) on {fit['card']} ({fit['card_source']}: "
                  f"{fit['bandwidth'] / 1e9:,.0f} GB/s, {fit['bf16_flops'] / 1e12:,.3g} TFLOP/s): efficiencies "
                  f"bandwidth {cf.get('bandwidth_eff')}{_undetermined(cf, 'bandwidth_eff')}, "
                  f"FLOPs {cf.get('flops_eff')}{_undetermined(cf, 'flops_eff')} "
                  f"({cf.get('note') or 'fitted on the compiled forwards, largest error ' + format(cf.get('max_abs_rel_error', 0), '.1%')}"
                  f"{', AT THE GRID EDGE' if cf.get('grid_edge') else ''}); launch cost "
                  f"{_fmt(ef.get('launch_s', 0) * 1e6, '.2f')} us per launch ({ef.get('launch_count_source', '-')}, "
                  f"{_fmt(ef.get('launches_per_forward_t1'), '.0f')} launches at 1 token; largest error "
                  f"{_fmt(ef.get('max_abs_rel_error'), '.1%')})"]
    proj = fit.get("projection", {})
    if proj.get("error"):
        return lines + ["", proj["error"]]
    if proj:
        names = proj["variants"]
        dry = "DRY RUN, CPU timings: meaningless as GPU figures. " if fit.get("dry_run") else ""
        lines += ["", f"{dry}PROJECTION (not a measurement) of Lumina-mGPT 7B 768x768 on {fit['card']} from the step "
                      f"compressions of {proj['bench_json']}: the paper-fitted constants (launch "
                      f"{proj['paper_launch_s'] * 1e6:.1f} us), and the constants re-fitted here", "",
                  "| backend | compr. | T/fwd | forwards | " + " | ".join(f"{n} s | {n} x AR" for n in names) + " |",
                  "| --- | --- | --- | --- | " + " | ".join("--- | ---" for _ in names) + " |"]
        for t in proj["rows"]:
            if "error" in t:
                lines.append(f"| {t['label']} | {t['error']} |")
                continue
            cells = " | ".join(f"{t[n]['seconds']:.2f} | {_fmt(t[n].get('speedup_vs_ar'), '.2f')}" for n in names)
            lines.append(f"| {t['label']} | {_fmt(t['step_compression_total'], '.2f')} | "
                         f"{t['tokens_per_forward']:.1f} | {t['forwards']:.0f} | {cells} |")
    return lines


__all__ = ["markdown"]
