"""A roofline model of decode forwards of a Llama-style AR image model on a GPU (a projection,
not a measurement: no GPU is lent to this project). Pure Python, no torch.

One forward is a list of kernels, each with the bytes it reads/writes in HBM, its FLOPs and how
many launches it takes in an eager PyTorch / transformers implementation (the papers' setting).
A kernel's time is max(bytes / (bandwidth * bandwidth_eff), flops / (peak * flops_eff)); a
forward's time is the sum over its kernels plus launches * launch_s, the host's cost per
launched op (Python, dispatch, launch), which eager decoding of a 7B model does not hide.

Free constants: `launch_s`, fitted once (`fit_launch_s`) on the published AR latencies of one
GPU; `bandwidth_eff` and `flops_eff` are assumed, not fitted (see EFFICIENCY). Everything else
comes from datasheets (GPUS) and the model's shape (LUMINA_MGPT_7B).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Optional, Sequence

# the `bench --json` run whose step compressions the projections use by default (the defaults run of 2026-11-25 on
# the demo model; docs/ lies beside the code in the repository root)
DEFAULT_BENCH_JSON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                  "docs/figures/bench_defaults_projection.json")


@dataclass(frozen=True)
class GPU:
    name: str
    bandwidth: float  # HBM / GDDR bytes per second (datasheet)
    bf16_flops: float  # dense bf16 tensor-core FLOP/s with fp32 accumulation (datasheet, no sparsity)
    source: str


GPUS = {
    "a100": GPU("A100-SXM4-80GB", 2.039e12, 312e12,
                "NVIDIA A100 Tensor Core GPU datasheet: 80GB SXM 2,039 GB/s; BF16 Tensor Core 312 TFLOPS (624 sparse)"),
    "h100": GPU("H100-SXM5-80GB", 3.35e12, 989e12,
                "NVIDIA H100 Tensor Core GPU datasheet: SXM 3.35 TB/s; BF16 Tensor Core 1,979 TFLOPS with sparsity "
                "= 989 dense"),
    "rtx4090": GPU("RTX 4090", 1.008e12, 165.2e12,
                   "NVIDIA Ada GPU architecture whitepaper, RTX 4090: 1,008 GB/s; FP16/BF16 tensor with FP32 "
                   "accumulate 165.2 TFLOPS dense"),
}


@dataclass(frozen=True)
class Efficiency:
    """The fractions of the datasheet peaks a kernel reaches (assumed; the launch term is fitted)."""
    bandwidth_eff: float = 0.8  # large weight-streaming GEMV/GEMM reach roughly 80% of HBM peak
    flops_eff: float = 0.7  # bf16 GEMMs of a few hundred rows reach well below the tensor-core peak


EFFICIENCY = Efficiency()


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    layers: int
    mlp: int  # intermediate size of the gated MLP
    vocab: int  # rows of the LM head (transformers computes the full head)
    head_rows_read: Optional[int] = None  # LM-head rows actually read (None: all of vocab)
    bytes_per_param: int = 2  # bf16
    qk_norm: bool = True  # Chameleon's per-head LayerNorm on q and k


# Lumina-mGPT 7B = Chameleon 7B: hidden 4096, 32 layers, 32 heads, MLP 11008, vocabulary 65536
# (the chameleon-7b shape of tooling/shapes.py). 768x768: 48 x 48 codes + 48 row ends + the
# image-start / height / width / end tokens = 2357 generated tokens (SJD paper, appendix C).
LUMINA_MGPT_7B = ModelShape("Lumina-mGPT 7B", hidden=4096, layers=32, mlp=11008, vocab=65536)
IMAGE_TOKENS_768 = 2357
IMAGE_CODES_768 = 48 * 48  # sampled codes (row ends are forced: our engine spends no forward on them)
PROMPT_TOKENS = 64  # text prompt before the image (assumed; it only sets the first context length)

# Launches (non-view aten ops) per kernel group of transformers' Chameleon in bf16 with eager
# attention, one decode step: 52 per layer and 33 outside the layers, as counted by
# tooling/tests/test_roofline.py (a TorchDispatchMode around a tiny model's forward).
RMSNORM_LAUNCHES = 8  # fp32 cast, pow, mean, add eps, rsqrt, mul, cast back, weight mul
QK_NORM_LAUNCHES = 6  # q and k: layer_norm, weight mul, bias add
ROTARY_LAUNCHES = 10  # q and k: x*cos, rotate_half (neg, cat), *sin, add
ATTENTION_LAUNCHES = 7  # q k^T, scale, + mask, fp32 cast, softmax, cast back, p v
MODEL_LAUNCHES = 33  # outside the layers: embedding, positions, rotary tables, mask, final norm, head
AR_SAMPLE_LAUNCHES = 12  # assumed: CFG combine, top-k, softmax, multinomial, append, the host read
VERIFY_LAUNCHES = 40  # assumed: targets, acceptance map, cumulative min, resample, commit (vectorised)


@dataclass(frozen=True)
class Kernel:
    name: str
    bytes: float  # all HBM traffic: weights, KV cache, activations
    flops: float
    launches: int = 1
    weight_bytes: float = 0.0  # the part of `bytes` that is parameters


def _gemm(name, rows, k, n, bpp, launches=1) -> Kernel:
    """[rows, k] @ [k, n]: the weight once, the activations in and out."""
    return Kernel(name, bpp * (k * n + rows * (k + n)), 2.0 * rows * k * n, launches, weight_bytes=bpp * k * n)


def _elementwise(name, elements, bpp, launches, passes=2) -> Kernel:
    return Kernel(name, passes * elements * bpp * launches, 0.0, launches)


def layer_kernels(shape: ModelShape, tokens: int, rows: int, context: int) -> list:
    """One decoder layer on `tokens` new tokens per row for `rows` rows (CFG: 2), after `context`
    cached tokens. Attention reads every cached K and V once."""
    D, I, b = shape.hidden, shape.mlp, shape.bytes_per_param
    n = rows * tokens  # activation rows
    keys = context + tokens
    kv_bytes = 2 * rows * keys * D * b  # K and V of this layer
    ks = [_elementwise("attn_norm", n * D, b, RMSNORM_LAUNCHES),
          _gemm("q_proj", n, D, D, b), _gemm("k_proj", n, D, D, b), _gemm("v_proj", n, D, D, b)]
    if shape.qk_norm:
        ks.append(_elementwise("qk_norm", 2 * n * D, b, QK_NORM_LAUNCHES))
    ks += [_elementwise("rotary", 2 * n * D, b, ROTARY_LAUNCHES),
           Kernel("kv_append", 2 * 2 * n * D * b, 0.0, 2),
           Kernel("attention", kv_bytes + 2 * n * D * b, 4.0 * rows * tokens * keys * D, ATTENTION_LAUNCHES),
           _gemm("o_proj", n, D, D, b), _elementwise("residual", n * D, b, 1, passes=3),
           _elementwise("mlp_norm", n * D, b, RMSNORM_LAUNCHES),
           _gemm("gate_proj", n, D, I, b), _gemm("up_proj", n, D, I, b),
           _elementwise("silu_mul", n * I, b, 2, passes=3), _gemm("down_proj", n, I, D, b),
           _elementwise("residual", n * D, b, 1, passes=3)]
    return ks


def forward_kernels(shape: ModelShape, tokens: int, rows: int, context: int) -> list:
    """Every kernel of one forward: the layers, then the final norm and the LM head."""
    b, n = shape.bytes_per_param, rows * tokens
    head_rows = shape.head_rows_read or shape.vocab
    ks = layer_kernels(shape, tokens, rows, context) * shape.layers
    ks += [Kernel("embed+tables", n * shape.hidden * b * 2, 0.0, MODEL_LAUNCHES - RMSNORM_LAUNCHES - 1),
           _elementwise("final_norm", n * shape.hidden, b, RMSNORM_LAUNCHES),
           _gemm("lm_head", n, shape.hidden, head_rows, b)]
    return ks


def forward_bytes(shape: ModelShape, tokens: int, rows: int, context: int) -> float:
    return sum(k.bytes for k in forward_kernels(shape, tokens, rows, context))


def forward_flops(shape: ModelShape, tokens: int, rows: int, context: int) -> float:
    return sum(k.flops for k in forward_kernels(shape, tokens, rows, context))


def forward_launches(shape: ModelShape, tokens: int = 1, rows: int = 2, context: int = 0) -> int:
    return sum(k.launches for k in forward_kernels(shape, tokens, rows, context))


def kernel_seconds(k: Kernel, gpu: GPU, eff: Efficiency = EFFICIENCY) -> float:
    """The roofline time of one kernel (launch cost not included)."""
    return max(k.bytes / (gpu.bandwidth * eff.bandwidth_eff), k.flops / (gpu.bf16_flops * eff.flops_eff))


def device_seconds(kernels: Sequence[Kernel], gpu: GPU, eff: Efficiency = EFFICIENCY) -> float:
    return sum(kernel_seconds(k, gpu, eff) for k in kernels)


@dataclass(frozen=True)
class Drafter:
    """A drafter network run before each verify forward: `calls` calls, each on `tokens` tokens per
    row (EAGLE: one per tree layer; heads: one on the last accepted position)."""
    name: str
    calls: int
    tokens: int  # tokens per row of each call
    layers: int  # decoder layers of the target's width (EAGLE: 1; Medusa/Hawk heads: 0)
    head_blocks: int  # residual SiLU blocks D x D (Hawk heads)
    image_rows: int  # LM-head rows each call projects onto (the image codes)
    band: int = 0  # committed positions the drafter's layer attends to

    def kernels(self, shape: ModelShape, rows: int) -> list:
        b, D, n = shape.bytes_per_param, shape.hidden, rows * self.tokens
        one = [_gemm("drafter_fc", n, 2 * D, D, b)] if self.layers else []
        one += layer_kernels(replace(shape, qk_norm=False), self.tokens, rows, self.band) * self.layers
        one += [_gemm("head_block", n, D, D, b, launches=3) for _ in range(self.head_blocks)]
        one += [_gemm("drafter_head", n, D, self.image_rows, b), Kernel("drafter_topk", n * self.image_rows * 4, 0, 3)]
        return one * self.calls


@dataclass(frozen=True)
class StepPlan:
    """One backend's generation: `forwards` verify forwards of `tokens` tokens per row each (a list
    of (tokens, share of the forwards) for a backend whose window changes), spread evenly over
    `image_tokens` positions, plus a drafter's calls before each."""
    forwards: float
    tokens: Sequence  # [(tokens per row, share of forwards)]
    image_tokens: int = IMAGE_TOKENS_768
    step_launches: int = VERIFY_LAUNCHES
    drafter: Optional[Drafter] = None


def step_seconds(shape, gpu, tokens, rows, context, launch_s, step_launches, drafter=None,
                 eff: Efficiency = EFFICIENCY) -> float:
    """One step: the verify forward at `context`, the sampling/verification ops, the drafter."""
    ks = forward_kernels(shape, tokens, rows, context)
    launches = sum(k.launches for k in ks) + step_launches
    if drafter is not None:
        dk = drafter.kernels(shape, rows)
        ks = ks + dk
        launches += sum(k.launches for k in dk)
    return device_seconds(ks, gpu, eff) + launches * launch_s


def generation_seconds(shape: ModelShape, gpu: GPU, plan: StepPlan, launch_s: float, rows: int = 2,
                       prompt_tokens: int = PROMPT_TOKENS, eff: Efficiency = EFFICIENCY, samples: int = 16) -> float:
    """Decode latency of one image: `plan.forwards` steps whose context grows evenly from the prompt
    to the end of the image (the KV term is linear in it, so `samples` evenly spaced contexts
    integrate it; max() makes this an approximation only where a kernel changes regime)."""
    total = 0.0
    for tokens, share in plan.tokens:
        per = [step_seconds(shape, gpu, tokens, rows, prompt_tokens + plan.image_tokens * (i + 0.5) / samples,
                            launch_s, plan.step_launches, plan.drafter, eff) for i in range(samples)]
        total += plan.forwards * share * sum(per) / samples
    return total


def fit_launch_s(rows: Sequence, shape: ModelShape = LUMINA_MGPT_7B, eff: Efficiency = EFFICIENCY) -> float:
    """The launch cost minimising the squared relative error over `rows` [(gpu, plan, published_s)]:
    latency is a + b * launch_s per row, so the least-squares solution is closed-form."""
    num = den = 0.0
    for gpu, plan, published in rows:
        a = generation_seconds(shape, gpu, plan, 0.0, eff=eff)
        b = generation_seconds(shape, gpu, plan, 1.0, eff=eff) - a
        num += (b / published) * (1.0 - a / published)
        den += (b / published) ** 2
    if den <= 0:
        raise ValueError("fit_launch_s needs at least one row whose latency depends on the launch cost")
    return num / den


# ---- published latencies of Lumina-mGPT 7B, 768x768, CFG as a batch of 2 (the seeds' papers) ----
@dataclass(frozen=True)
class PublishedRow:
    source: str  # paper, table, dataset
    gpu: str  # key of GPUS
    method: str
    steps: float  # forwards per image (NFE, or generated tokens / step compression)
    tokens: int  # tokens per row of each forward (window L, plus tree nodes)
    latency_s: Optional[float] = None  # published seconds per image
    speedup: Optional[float] = None  # published latency ratio to AR (rows without absolute latency)
    ar_steps: float = IMAGE_TOKENS_768  # the AR baseline of a speedup row
    fit: bool = False  # used to fit launch_s (not a prediction)

    def plan(self) -> StepPlan:
        ar = self.tokens == 1
        return StepPlan(self.steps, [(self.tokens, 1.0)], step_launches=AR_SAMPLE_LAUNCHES if ar else VERIFY_LAUNCHES)


SJD_T1 = "SJD (Teng et al.) Table 1, MS-COCO"
SJD_T2 = "SJD (Teng et al.) Table 2, Parti"
SCD_T1 = "SCD (So et al.) Table 1, MS-COCO"
SCD_T5 = "SCD (So et al.) Table 5, Parti"
PAC = "SJD-PAC (Kang et al.) summary, MS-COCO, GPU unnamed"  # A100 assumed: the other papers' GPU
_N = IMAGE_TOKENS_768
PUBLISHED = [
    PublishedRow(SJD_T1, "a100", "AR", _N, 1, latency_s=87.23, fit=True),
    PublishedRow(SCD_T1, "a100", "AR", 2390, 1, latency_s=102.03, fit=True),
    PublishedRow(SCD_T5, "a100", "AR", 2392, 1, latency_s=112.29, fit=True),
    PublishedRow(SJD_T2, "rtx4090", "AR", _N, 1, latency_s=100.69),
    PublishedRow(SJD_T1, "a100", "SJD L=16 (2.22x steps)", _N / 2.22, 16, latency_s=42.73),
    PublishedRow(SJD_T2, "rtx4090", "SJD L=16 (2.26x steps)", _N / 2.26, 16, latency_s=47.52),
    PublishedRow(SCD_T1, "a100", "SJD L=16", 1058.6, 16, latency_s=43.02),
    PublishedRow(SCD_T1, "a100", "SCD maximal L=16", 814.5, 16, latency_s=32.75),
    PublishedRow(SCD_T1, "a100", "SCD gumbel L=16", 819.4, 16, latency_s=32.89),
    PublishedRow(SCD_T1, "a100", "SJD L=32", 1031.2, 32, latency_s=42.99),
    PublishedRow(SCD_T1, "a100", "SCD maximal L=32", 666.0, 32, latency_s=26.77),
    PublishedRow(SCD_T1, "a100", "SCD gumbel L=32", 652.3, 32, latency_s=26.44),
    PublishedRow(SCD_T1, "a100", "SJD L=64", 1035.9, 64, latency_s=42.98),
    PublishedRow(SCD_T1, "a100", "SCD maximal L=64", 567.7, 64, latency_s=24.41),
    PublishedRow(SCD_T1, "a100", "SCD gumbel L=64", 568.0, 64, latency_s=24.24),
    PublishedRow(SCD_T5, "a100", "SJD L=16", 1035.3, 16, latency_s=42.07),
    PublishedRow(SCD_T5, "a100", "SCD maximal L=16", 817.29, 16, latency_s=32.86),
    PublishedRow(SCD_T5, "a100", "SJD L=32", 1038.2, 32, latency_s=43.27),
    PublishedRow(SCD_T5, "a100", "SCD maximal L=32", 647.08, 32, latency_s=26.01),
    PublishedRow(SCD_T5, "a100", "SJD L=64", 1036.2, 64, latency_s=42.99),
    PublishedRow(SCD_T5, "a100", "SCD maximal L=64", 548.26, 64, latency_s=23.58),
    # L=64 window plus the proactive tree's (K-1) x D = 9 extra nodes (D=3, K=4)
    PublishedRow(PAC, "a100", "SJD-PAC L=64 D=3 K=4 (4.51x steps)", _N / 4.51, 64 + 9, speedup=3.80),
    PublishedRow(PAC, "a100", "SJD (2.22x steps)", _N / 2.22, 16, speedup=2.05),
]


def fitted_launch_s(rows: Sequence[PublishedRow] = PUBLISHED, eff: Efficiency = EFFICIENCY) -> float:
    return fit_launch_s([(GPUS[r.gpu], r.plan(), r.latency_s) for r in rows if r.fit], eff=eff)


def reproduce(rows: Sequence[PublishedRow] = PUBLISHED, launch_s: Optional[float] = None,
              eff: Efficiency = EFFICIENCY) -> list:
    """Published vs projected, per row: {row, projected (s or speedup), published, rel_error}."""
    launch_s = fitted_launch_s(rows, eff) if launch_s is None else launch_s
    out = []
    for r in rows:
        gpu = GPUS[r.gpu]
        seconds = generation_seconds(LUMINA_MGPT_7B, gpu, r.plan(), launch_s, eff=eff)
        if r.latency_s is not None:
            projected, published = seconds, r.latency_s
        else:
            ar = PublishedRow(r.source, r.gpu, "AR", r.ar_steps, 1).plan()
            projected, published = generation_seconds(LUMINA_MGPT_7B, gpu, ar, launch_s, eff=eff) / seconds, r.speedup
        out.append({"row": r, "projected": projected, "published": published, "rel_error": projected / published - 1})
    return out


# ---- our backends, projected from their measured step compression on the demo model ----
ROW_CODES = 48  # codes per image row of the 768x768 geometry (a forced row end follows each)
IMAGE_CODE_ROWS = 8192  # LM-head rows a drafter projects onto: Lumina-mGPT's image codes


def backend_plan(row: dict, image_codes: int = IMAGE_CODES_768) -> StepPlan:
    """The 7B plan of one `bench --json` row: forwards = image codes / the row's total step
    compression; tokens per forward and the drafter network from the backend's step cost (step_costs.py)."""
    try:
        return _backend_plan(row, image_codes)
    except KeyError as e:
        raise ValueError(f"bench row {row.get('label', row.get('backend'))!r} lacks {e.args[0]!r} (a `bench --json` "
                         f"row has backend, params and step_compression_total)") from None


def _backend_plan(row: dict, image_codes: int) -> StepPlan:
    from .step_costs import STEP_COSTS
    name, p = row["backend"], row.get("params") or {}
    compression = row.get("step_compression_total") or row.get("step_compression")
    if not compression or compression <= 0:
        raise ValueError(f"bench row {row.get('label', name)!r} has no positive step compression")
    if name not in STEP_COSTS:
        raise ValueError(f"no projection for backend {name!r} (tooling/step_costs.py has no step cost for it); "
                         f"known: {', '.join(STEP_COSTS)}")
    cost = STEP_COSTS[name](p, ROW_CODES, row.get(name) or [])  # a backend's reports: the row's key of its name
    net = cost.network
    drafter = None if net is None else Drafter(f"{name} drafter", net.calls, net.tokens, net.layers, net.head_blocks,
                                               IMAGE_CODE_ROWS, band=net.band)
    return StepPlan(image_codes / compression, list(cost.tokens), drafter=drafter)


def mean_tokens(plan: StepPlan) -> float:
    return sum(t * share for t, share in plan.tokens)


SENSITIVITY = [Efficiency(1.0, 1.0), Efficiency(0.9, 0.9), Efficiency(0.8, 0.7), Efficiency(0.7, 0.5),
               Efficiency(0.6, 0.35)]


def sensitivity(effs: Sequence[Efficiency] = SENSITIVITY) -> list:
    """How the assumed efficiencies move the result: launch_s refitted on the same AR rows for each,
    and the largest error among the predicted rows."""
    out = []
    for eff in effs:
        launch = fitted_launch_s(eff=eff)
        errors = [r["rel_error"] for r in reproduce(launch_s=launch, eff=eff) if not r["row"].fit]
        out.append({"efficiency": eff, "launch_s": launch, "max_abs_error": max(abs(e) for e in errors)})
    return out


def single_row_fits(rows: Sequence[PublishedRow] = PUBLISHED) -> list:
    """launch_s fitted on each fit row alone: how much the choice of the fit rows moves the result
    (the largest error among the rows that were not fitted)."""
    out = []
    for chosen in (r for r in rows if r.fit):
        alone = [replace(r, fit=r is chosen) for r in rows]
        launch = fitted_launch_s(alone)
        errors = [abs(r["rel_error"]) for r in reproduce(alone, launch_s=launch) if not r["row"].fit]
        out.append({"row": chosen, "launch_s": launch, "max_abs_error": max(errors)})
    return out
