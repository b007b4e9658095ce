"""Weight-only quantization of a model's linear layers: int8 (per output channel) and int4 (per group of
128 input columns, two codes packed per byte), dequantised inside the matmul.

Pure torch (no compiled extension, nothing downloaded): the same code runs on CUDA, the CPU and any
device torch supports, and it is plain tensor arithmetic that torch.compile captures in the
compiled step's graph (``fullgraph=True``), which is why it is our own module rather than torchao, bitsandbytes or
optimum-quanto.

What is quantized: every ``nn.Linear`` of the decoder (attention and MLP projections, image heads
such as Janus' generation head) except the modules named by `SKIP` (the text ``lm_head`` whose rows
the shared-vocabulary adapters copy, and the VQ image decoders). Embeddings and norms keep the
model's dtype.

Symmetric, round-to-nearest: ``w ~= q * scale`` with q in [-127, 127] (int8) or [-8, 7] (int4),
scale = max |w| of the output channel / group divided by 127 / 7, computed in float32 and kept in
the model's dtype. The quantized model is the target: speculative decoding is exact with respect to
what it computes (tests/test_quantize.py), not with respect to the unquantized weights.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

QUANTIZE_MODES = ("none", "int8", "int4")
GROUP_SIZE = 128  # int4: input columns per scale
SKIP = ("lm_head", "vq")  # module names containing these stay unquantized


def check_mode(quantize) -> str:
    """"none" for None / "none", else the mode; ValueError naming the value and the choices."""
    if quantize is None or quantize is False:
        return "none"
    if isinstance(quantize, str) and quantize.lower() in QUANTIZE_MODES:
        return quantize.lower()
    raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_MODES)} (weight-only int8 / int4), "
                     f"got {quantize!r}")


class QuantLinear(nn.Module):
    """A frozen linear layer with int8 or packed-int4 weights; ``forward`` equals ``F.linear`` with the
    dequantised weight."""

    def __init__(self, in_features: int, out_features: int, bits: int, group_size: int, dtype: torch.dtype,
                 bias: bool = False):
        super().__init__()
        if bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {bits!r}")
        self.in_features, self.out_features, self.bits, self.group_size = in_features, out_features, bits, group_size
        if bits == 8:
            self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
            self.register_buffer("scales", torch.ones(out_features, dtype=dtype))
        else:
            groups = in_features // group_size
            # [out, groups, group/2]: low nibble = the group's first half of columns, high nibble = its second
            self.register_buffer("qweight", torch.zeros(out_features, groups, group_size // 2, dtype=torch.uint8))
            self.register_buffer("scales", torch.ones(out_features, groups, 1, dtype=dtype))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int, group_size: int = GROUP_SIZE) -> "QuantLinear":
        w = linear.weight.detach()
        out_f, in_f = w.shape
        group = group_size if in_f % group_size == 0 else in_f  # a width the group does not divide: per channel
        q = cls(in_f, out_f, bits, group, w.dtype, bias=linear.bias is not None).to(w.device)
        wf = w.float()
        if bits == 8:
            scale = (wf.abs().amax(-1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
            q.qweight.copy_((wf / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
            q.scales.copy_(scale.to(w.dtype))
        else:
            wg = wf.reshape(out_f, in_f // group, group)
            scale = (wg.abs().amax(-1, keepdim=True) / 7).clamp(min=torch.finfo(torch.float32).tiny)
            codes = ((wg / scale).round().clamp(-8, 7) + 8).to(torch.uint8)  # 0..15
            half = group // 2
            q.qweight.copy_(codes[..., :half] | (codes[..., half:] << 4))
            q.scales.copy_(scale.to(w.dtype))
        if linear.bias is not None:
            q.bias.copy_(linear.bias.detach())
        return q

    def dequantized_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The [out, in] weight this layer computes with, in `dtype`."""
        if self.bits == 8:
            return self.qweight.to(dtype) * self.scales.to(dtype)[:, None]
        codes = torch.cat([self.qweight & 15, self.qweight >> 4], -1).to(dtype) - 8
        return (codes * self.scales.to(dtype)).reshape(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bits == 8:  # the per-channel scale factors out of the product: it scales the outputs
            y = F.linear(x, self.qweight.to(x.dtype)) * self.scales.to(x.dtype)
            return y if self.bias is None else y + self.bias.to(x.dtype)
        return F.linear(x, self.dequantized_weight(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int{self.bits}, group={self.group_size}"


@dataclass
class QuantizeReport:
    mode: str
    layers: int = 0  # linear layers replaced
    bytes_before: int = 0  # their weights (and biases) before, in the model's dtype
    bytes_after: int = 0  # their codes, scales and biases after


def _nbytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))


def quantize_module(module: nn.Module, quantize, group_size: int = GROUP_SIZE, skip=SKIP) -> QuantizeReport:
    """Replace the linear layers of `module` (in place) by `QuantLinear` ("int8" / "int4"; "none":
    nothing). Modules whose qualified name contains one of `skip` are left as they are."""
    mode = check_mode(quantize)
    report = QuantizeReport(mode)
    if mode == "none":
        return report
    bits = 8 if mode == "int8" else 4
    targets = [(name, m) for name, m in module.named_modules()
               if isinstance(m, nn.Linear) and not any(s in name for s in skip)]
    with torch.no_grad():
        for name, linear in targets:
            if bits == 4 and linear.in_features % 2:
                continue  # an odd width cannot be packed two codes per byte: kept as it is
            parent = module.get_submodule(name.rpartition(".")[0]) if "." in name else module
            q = QuantLinear.from_linear(linear, bits, group_size)
            report.layers += 1
            report.bytes_before += _nbytes(linear)
            report.bytes_after += _nbytes(q)
            setattr(parent, name.rpartition(".")[2], q)
    return report
