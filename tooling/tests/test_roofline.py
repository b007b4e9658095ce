"""The roofline projection (tooling/roofline.py): its byte / FLOP accounting against hand computations,
its regimes, the launch-cost fit, the bench-row plans, and the published rows it claims to reproduce.
Nothing here is timed: the model is pure arithmetic."""
import json
import subprocess
import sys

import pytest

from specar.tooling import roofline as rl
from specar.tooling.step_costs import STEP_COSTS, DraftNetworkCost, StepCost, chain_tokens

# a shape small enough to count by hand
TINY = rl.ModelShape("tiny", hidden=8, layers=2, mlp=12, vocab=32, bytes_per_param=2)


def hand_weight_bytes(s: rl.ModelShape) -> int:
    """q, k, v, o (4 D^2) and gate, up, down (3 D I) per layer, plus the LM head (V D)."""
    return s.bytes_per_param * (s.layers * (4 * s.hidden ** 2 + 3 * s.hidden * s.mlp) + s.vocab * s.hidden)


def hand_kv_bytes(s: rl.ModelShape, rows: int, keys: int) -> int:
    """Every layer's K and V of `keys` positions, each row, read once by attention."""
    return s.layers * 2 * rows * keys * s.hidden * s.bytes_per_param


def hand_flops(s: rl.ModelShape, tokens: int, rows: int, context: int) -> int:
    """2 FLOPs per weight per token row, plus attention's q k^T and p v: 4 T (context + T) D per layer and row."""
    n = rows * tokens
    matmul = 2 * n * (s.layers * (4 * s.hidden ** 2 + 3 * s.hidden * s.mlp) + s.vocab * s.hidden)
    return matmul + s.layers * 4 * rows * tokens * (context + tokens) * s.hidden


def accounting_errors(module, shape=TINY) -> list:
    """Mismatches between the module's accounting and the hand computation, on a few sizes."""
    errors = []
    for tokens, rows, context in [(1, 1, 0), (1, 2, 5), (3, 2, 7), (4, 1, 11)]:
        ks = module.forward_kernels(shape, tokens, rows, context)
        weights = sum(k.weight_bytes for k in ks)
        if weights != hand_weight_bytes(shape):
            errors.append(("weights", tokens, rows, context, weights))
        # the KV cache is the only traffic that grows with the context, by exactly its own size
        grown = module.forward_bytes(shape, tokens, rows, context) - module.forward_bytes(shape, tokens, rows, 0)
        if grown != hand_kv_bytes(shape, rows, context):
            errors.append(("kv", tokens, rows, context, grown))
        attention = sum(k.bytes for k in ks if k.name == "attention")
        if attention < hand_kv_bytes(shape, rows, context + tokens):
            errors.append(("attention reads less than the KV cache", tokens, rows, context, attention))
        if module.forward_flops(shape, tokens, rows, context) != hand_flops(shape, tokens, rows, context):
            errors.append(("flops", tokens, rows, context))
    return errors


def test_bytes_and_flops_match_the_hand_computation():
    assert accounting_errors(rl) == []
    # the non-weight, non-KV remainder (activations) is small for a decode step of a wide model
    s, keys = rl.LUMINA_MGPT_7B, 2000
    total = rl.forward_bytes(s, 1, 2, keys - 1)
    assert hand_weight_bytes(s) + hand_kv_bytes(s, 2, keys) <= total < 1.01 * (hand_weight_bytes(s) +
                                                                                 hand_kv_bytes(s, 2, keys))


def test_planted_accounting_errors_are_caught(monkeypatch):
    real = rl.layer_kernels

    def forgets_kv(shape, tokens, rows, context):  # attention reading only the new tokens' K and V
        return [rl.Kernel(k.name, 2 * 2 * rows * tokens * shape.hidden * shape.bytes_per_param, k.flops, k.launches)
                if k.name == "attention" else k for k in real(shape, tokens, rows, context)]

    monkeypatch.setattr(rl, "layer_kernels", forgets_kv)
    assert any(e[0] == "kv" for e in accounting_errors(rl))

    def drops_up_proj(shape, tokens, rows, context):
        return [k for k in real(shape, tokens, rows, context) if k.name != "up_proj"]

    monkeypatch.setattr(rl, "layer_kernels", drops_up_proj)
    kinds = {e[0] for e in accounting_errors(rl)}
    assert {"weights", "flops"} <= kinds


def test_kernel_time_is_the_roofline_of_bandwidth_and_compute():
    gpu, eff = rl.GPUS["a100"], rl.Efficiency(bandwidth_eff=1.0, flops_eff=1.0)
    bw, peak = 2.039e12, 312e12
    D = 4096
    # ridge point of a [n, D] x [D, D] bf16 GEMM: 2 n D^2 / peak = 2 (D^2 + 2 n D) / bw
    for n in (1, 16, 64):
        k = rl._gemm("q", n, D, D, 2)
        assert rl.kernel_seconds(k, gpu, eff) == pytest.approx(2 * (D * D + 2 * n * D) / bw)
    for n in (512, 4096):
        k = rl._gemm("q", n, D, D, 2)
        assert rl.kernel_seconds(k, gpu, eff) == pytest.approx(2 * n * D * D / peak)


def test_forward_time_is_monotone_in_tokens_and_flat_while_bandwidth_bound():
    s = rl.LUMINA_MGPT_7B
    for gpu in (rl.GPUS["a100"], rl.GPUS["h100"]):
        times = [rl.step_seconds(s, gpu, t, 2, 1000, 20e-6, rl.VERIFY_LAUNCHES) for t in range(1, 300, 7)]
        assert all(b >= a for a, b in zip(times, times[1:]))
        device = [rl.device_seconds(rl.forward_kernels(s, t, 2, 1000), gpu) for t in (1, 8, 16, 512)]
        assert device[1] < 1.05 * device[0] and device[2] < 1.10 * device[0]  # weight streaming dominates
        assert device[3] > 2.5 * device[0]  # compute-bound: grows with the tokens
    # a faster GPU never projects a slower forward
    a100 = rl.step_seconds(s, rl.GPUS["a100"], 64, 2, 1000, 20e-6, 40)
    assert rl.step_seconds(s, rl.GPUS["h100"], 64, 2, 1000, 20e-6, 40) < a100


def test_generation_sums_steps_over_a_growing_context():
    s, gpu = rl.LUMINA_MGPT_7B, rl.GPUS["a100"]
    plan = rl.StepPlan(200, [(17, 1.0)], image_tokens=2000)
    brute = sum(rl.step_seconds(s, gpu, 17, 2, rl.PROMPT_TOKENS + 2000 * (i + 0.5) / 200, 20e-6, plan.step_launches)
                for i in range(200))
    assert rl.generation_seconds(s, gpu, plan, 20e-6) == pytest.approx(brute, rel=1e-3)
    # the KV cache makes late steps slower than early ones
    first = rl.step_seconds(s, gpu, 1, 2, 64, 0.0, 0)
    last = rl.step_seconds(s, gpu, 1, 2, 2400, 0.0, 0)
    assert last - first == pytest.approx(hand_kv_bytes(s, 2, 2400 - 64) / (gpu.bandwidth * rl.EFFICIENCY.bandwidth_eff),
                                         rel=0.02)


def test_launch_fit_recovers_a_planted_launch_cost():
    s = rl.LUMINA_MGPT_7B
    plans = [(rl.GPUS["a100"], rl.StepPlan(2357, [(1, 1.0)])), (rl.GPUS["h100"], rl.StepPlan(800, [(33, 1.0)]))]
    rows = [(gpu, plan, rl.generation_seconds(s, gpu, plan, 17e-6)) for gpu, plan in plans]
    assert rl.fit_launch_s(rows) == pytest.approx(17e-6, rel=1e-9)
    with pytest.raises(ValueError, match="launch"):
        rl.fit_launch_s([])
    # one published row alone is fitted exactly, and each choice gives its own launch cost
    alone = rl.single_row_fits()
    assert len(alone) == sum(r.fit for r in rl.PUBLISHED) and len({a["launch_s"] for a in alone}) == len(alone)
    for a in alone:
        own = rl.generation_seconds(rl.LUMINA_MGPT_7B, rl.GPUS[a["row"].gpu], a["row"].plan(), a["launch_s"])
        assert own == pytest.approx(a["row"].latency_s, rel=1e-9)


def test_published_rows_are_reproduced_within_25_percent_and_fit_only_on_ar():
    results = rl.reproduce()
    fitted = [r["row"] for r in results if r["row"].fit]
    assert fitted and all(r.method == "AR" and r.gpu == "a100" for r in fitted)
    predicted = [r for r in results if not r["row"].fit]
    assert any(r["row"].tokens > 1 for r in predicted) and any(r["row"].gpu == "rtx4090" for r in predicted)
    for r in results:
        assert abs(r["rel_error"]) < 0.25, (r["row"], r["projected"], r["published"])


def bench_row(backend, params, compression, **extra):
    return {"backend": backend, "label": backend, "params": params, "step_compression_total": compression, **extra}


def test_backend_plans_from_bench_rows():
    codes = rl.IMAGE_CODES_768
    ar = rl.backend_plan(bench_row("ar", {}, 1.0))
    assert ar.forwards == codes and list(ar.tokens) == [(1, 1.0)] and ar.drafter is None
    sjd = rl.backend_plan(bench_row("sjd", {"window": 64}, 4.0))
    assert sjd.forwards == codes / 4.0 and list(sjd.tokens) == [(1 + 64 + 1, 1.0)]  # one row end in 64 codes
    pac = rl.backend_plan(bench_row("sjd_pac", {"window": 16, "tree_depth": 3, "tree_width": 4}, 2.0))
    assert list(pac.tokens) == [(17 + 9, 1.0)]
    auto = rl.backend_plan(bench_row("auto", {}, 8.0, auto=[{"steps_per_window": {"32": 30, "0": 10}},
                                                            {"steps_per_window": {"32": 20}}]))
    assert sorted(auto.tokens) == [(1, 10 / 60), (33, 50 / 60)]
    adt = rl.backend_plan(bench_row("adt_tree", {"node_budget": 32, "depth": 5, "width": 8}, 2.0))
    assert adt.drafter.calls == 5 and adt.drafter.layers == 1
    # the drafter's cost is added to every step
    s, gpu = rl.LUMINA_MGPT_7B, rl.GPUS["a100"]
    without = rl.StepPlan(adt.forwards, adt.tokens)
    assert rl.generation_seconds(s, gpu, adt, 20e-6) > rl.generation_seconds(s, gpu, without, 20e-6)
    with pytest.raises(ValueError, match="'eagle'"):
        rl.backend_plan(bench_row("eagle", {}, 2.0))
    with pytest.raises(ValueError, match="step compression"):
        rl.backend_plan(bench_row("sjd", {"window": 16}, 0.0))
    with pytest.raises(ValueError, match="'window'"):
        rl.backend_plan(bench_row("scd", {}, 3.0))


def test_every_backend_has_a_projection():
    """Every backend of the registry has a step cost in tooling/step_costs.py (a new backend adds one there)."""
    from specar.samplers import backends
    for name in backends.SCHEMAS:
        params = dict(backends.make_backend(name).params())
        reports = [{"steps_per_window": {"16": 3, "0": 1}, "tuned": {"node_budget": 4}}]  # auto's, hawk's + adt_tree's
        plan = rl.backend_plan({"backend": name, "params": params, "step_compression_total": 2.0, name: reports})
        assert plan.forwards > 0 and all(t >= 1 for t, _ in plan.tokens), name


def test_a_new_backend_is_projected_from_its_step_cost(monkeypatch):
    def throwaway_cost(p, row_codes, reports):
        return StepCost(((chain_tokens(p["window"], row_codes), 1.0),), DraftNetworkCost(1, 1, head_blocks=2))

    monkeypatch.setitem(STEP_COSTS, "throwaway", throwaway_cost)
    plan = rl.backend_plan({"backend": "throwaway", "params": {"window": 8}, "step_compression_total": 2.0})
    assert list(plan.tokens) == [(9, 1.0)] and plan.drafter.head_blocks == 2
    assert plan.forwards == rl.IMAGE_CODES_768 / 2.0


def test_shape_bench_roofline_command(tmp_path):
    bench = tmp_path / "bench.json"
    # AR is not the first row: the speedups are still against it
    bench.write_text(json.dumps({"rows": [bench_row("scd", {"window": 16}, 5.0), bench_row("ar", {}, 1.0)]}))
    out = tmp_path / "roof.json"
    cmd = [sys.executable, "-m", "specar.tooling", "shape-bench", "--roofline", "--bench-json", str(bench), "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "PROJECTION" in res.stdout
    rows = [line for line in res.stdout.splitlines() if line.startswith("projection ")]
    assert len(rows) == 2  # every backend row is labelled a projection
    data = json.loads(out.read_text())
    assert data["kind"] == "projection" and all(b["kind"] == "projection" for b in data["backends"])
    scd, ar = (data["backends"][i]["A100-SXM4-80GB"] for i in (0, 1))
    assert ar["speedup_vs_ar"] == 1.0 and scd["speedup_vs_ar"] == pytest.approx(ar["seconds"] / scd["seconds"])
    assert 1 < scd["speedup_vs_ar"] <= 5.0 and scd["seconds_without_launch_cost"] < scd["seconds"]
    bad = subprocess.run(cmd[:-4] + ["--bench-json", str(tmp_path / "missing.json")], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "missing.json" in bad.stderr and "Traceback" not in bad.stderr


# aten ops that only make a new view of a tensor: no kernel is launched for them
VIEW_OPS = {"view", "_unsafe_view", "reshape", "expand", "transpose", "permute", "slice", "select", "unsqueeze",
            "squeeze", "t", "alias", "detach", "as_strided", "split", "unbind", "narrow", "lift_fresh", "empty"}


def _launches_of_transformers_chameleon(layers: int) -> int:
    """Non-view aten ops of one decode step (batch 2, 20 cached tokens) of a tiny bf16 transformers
    Chameleon with eager attention: what would each launch a kernel on a GPU."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.launches = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.launches += func.overloadpacket.__name__ not in VIEW_OPS
            return func(*args, **(kwargs or {}))

    cfg = transformers.ChameleonConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                                       vq_config={"embed_dim": 8, "num_embeddings": 16},
                                       vocabulary_map={"<image>": 3}, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.ChameleonForConditionalGeneration(cfg).eval().to(torch.bfloat16)
    cache = transformers.DynamicCache(config=cfg)
    step = torch.randint(10, 400, (2, 1))
    with torch.no_grad():
        model(input_ids=torch.randint(10, 400, (2, 20)), past_key_values=cache, use_cache=True)
        with CountOps() as count:
            model(input_ids=step, past_key_values=cache, use_cache=True)
    return count.launches


def test_launch_counts_are_those_of_transformers_chameleon():
    one, two = _launches_of_transformers_chameleon(1), _launches_of_transformers_chameleon(2)
    shape = rl.ModelShape("tiny chameleon", hidden=64, layers=1, mlp=128, vocab=512)
    per_layer = sum(k.launches for k in rl.layer_kernels(shape, 1, 2, 20))
    assert two - one == per_layer, f"transformers launches {two - one} ops per layer, the model counts {per_layer}"
    assert one - per_layer == rl.MODEL_LAUNCHES
    assert rl.forward_launches(shape) == one
