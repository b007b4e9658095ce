"""A graph pass for the compiled CPU step: a matrix product of a few rows as one multiply-and-sum.

A decode step multiplies a few rows (one token per image, times two with CFG) by every weight
matrix of the model. BLAS's GEMM is built for many rows: at two rows most of its time goes to its
own set-up and threading, not to reading the weights (on the demo model at 2 CPU threads the
compiled 1-token forward takes 1.769 ms with GEMM, 0.781 ms with this rewrite:
docs/figures/compile_rows.json). Written as
``out[m, n] = sum_k x[m, k] * W[n, k]`` the product is one inductor reduction kernel along the
weight's contiguous rows, which reads each weight row once per input row. With this pass compiled
AR on the demo model went from 1.37x to 2.92x eager AR (measured 2026-11-25).

Only inside the compiled step on the CPU (`shape_compiled.compile_settings`), only for float32 products
of at most `MAX_ROWS` rows with static shapes: eager steps and wider forwards (Jacobi chains,
trees) keep BLAS. The sum's order differs from BLAS's, so a logit can differ in its last bits;
tokens agree with eager unless a sampling race is that close (tests/test_compile.py,
tests/test_few_rows_matmul.py). `few_rows_pass` gives None when this torch has no custom-pass
API: the compiled step then runs without it.
"""
from __future__ import annotations

import torch

# Rows (tokens x CFG branches x images) up to which the multiply-and-sum replaces GEMM: the last
# count where it won by more than 1.2x in `python -m specar.tooling compile-rows` (the demo model's compiled
# forward, 2 CPU threads; docs/figures/compile_rows.json): its cost grows with the rows, GEMM's
# hardly does, and at 66 rows GEMM is faster.
MAX_ROWS = 12

try:
    from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
    from torch._inductor.pattern_matcher import Arg, CallFunction, PatternMatcherPass, register_graph_pattern
except ImportError:  # an older torch: no custom passes
    CustomGraphPass = None

aten = torch.ops.aten


def _mm(a, b):
    return torch.sum(a[:, :, None] * b[None, :, :], dim=1)


def _addmm(c, a, b):
    return _mm(a, b) + c


def _keep_inputs(*nodes) -> None:
    # the reduction reads its inputs n times: they must be computed once into a buffer, not
    # inlined into it (inductor would otherwise recompute, e.g., the norm before each product)
    for node in nodes:
        if isinstance(node, torch.fx.Node):
            node.meta["inductor_realize_to_strides"] = True


def few_rows_pass(max_rows: int = MAX_ROWS):
    """Inductor's ``post_grad_custom_pre_pass`` rewriting products of at most `max_rows` rows
    (None when this torch has no custom-pass API, or `max_rows` is 0)."""
    if CustomGraphPass is None or max_rows <= 0:
        return None
    return _FewRowsMatmul(max_rows)


if CustomGraphPass is not None:
    class _FewRowsMatmul(CustomGraphPass):
        def __init__(self, max_rows: int):
            self.max_rows = max_rows
            self.patterns = PatternMatcherPass(pass_name="specar_few_rows_matmul")
            register_graph_pattern(CallFunction(aten.mm, Arg(), Arg()), pass_dict=self.patterns)(self._rewrite(_mm))
            register_graph_pattern(CallFunction(aten.addmm, Arg(), Arg(), Arg()),
                                   pass_dict=self.patterns)(self._rewrite(_addmm))

        def _rewrite(self, replacement):
            def handler(match, *args):
                mat1, mat2 = args[-2:]
                if self._few_rows(mat1, mat2):
                    match.replace_by_example(replacement, list(args))
                    _keep_inputs(mat1, mat2)
            return handler

        def _few_rows(self, mat1, mat2) -> bool:
            a, b = (getattr(m, "meta", {}).get("val") for m in (mat1, mat2))
            if a is None or b is None:
                return False
            return (a.dim() == 2 and b.dim() == 2 and a.device.type == "cpu"
                    and a.dtype == b.dtype == torch.float32 and isinstance(a.shape[0], int)
                    and a.shape[0] <= self.max_rows)

        def __call__(self, graph: torch.fx.Graph) -> None:
            self.patterns.apply(graph)

        def uuid(self):
            # part of the compiled graph's cache key: a change of this file or of the limit compiles again
            return (get_hash_for_files((__file__,)), self.max_rows)


__all__ = ["MAX_ROWS", "few_rows_pass"]
