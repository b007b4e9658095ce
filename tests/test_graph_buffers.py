"""The walk over a step's state that the CUDA-graph path uses (model_loaders/compiled.py): which tensors a
step kept (static addresses for CUDA graphs) and copies of what it made (a CUDA graph's outputs are
overwritten by its next replay). Checked on the CPU; docs/BENCHMARKS.md "GPU check" has the GPU runs."""
from collections import namedtuple
from dataclasses import dataclass

import torch

from specar.model_loaders.compiled import copy_graph_outputs, mark_static_addresses, reachable_tensors

Pair = namedtuple("Pair", "a b")


@dataclass(frozen=True)
class Draft:
    tokens: torch.Tensor
    pair: Pair


@dataclass
class State:
    seq: torch.Tensor
    frontier: torch.Tensor
    draft: Draft
    extras: dict
    model: object = None


class Model:
    def torch_module(self):
        return self.net

    def __init__(self):
        self.net = torch.nn.Linear(2, 2)
        self.table = torch.ones(3)


def make_state():
    return State(seq=torch.arange(6), frontier=torch.tensor([2]),
                 draft=Draft(torch.tensor([7, 8]), Pair(torch.zeros(2), (torch.ones(1),))),
                 extras={"noise": [torch.full((2,), 3.0)]}, model=Model())


def test_every_state_tensor_is_reached_and_no_weight():
    st = make_state()
    found = reachable_tensors(st)
    want = [st.seq, st.frontier, st.draft.tokens, st.draft.pair.a, st.draft.pair.b[0], st.extras["noise"][0]]
    assert sorted(found) == sorted(id(t) for t in want)
    assert id(st.model.table) not in found and not any(isinstance(t, torch.nn.Parameter) for t in found.values())


def test_what_the_step_made_is_copied_and_what_it_kept_is_not():
    st = make_state()
    kept = reachable_tensors(st)
    seq = st.seq
    # a step: writes seq in place, replaces the frontier and the (frozen) draft's tensors
    seq[3] = 42
    st.frontier = st.frontier + 1
    object.__setattr__(st.draft, "tokens", st.draft.tokens * 2)
    made = {"frontier": st.frontier, "tokens": st.draft.tokens, "pair": st.draft.pair}
    out = (st.frontier[0] + 0,)
    new_out = copy_graph_outputs((out, st), kept)[0]
    assert st.seq is seq and st.seq[3] == 42  # kept: the same buffer
    assert st.draft.pair is made["pair"]  # nothing new inside: the same tuple
    for now, before in ((st.frontier, made["frontier"]), (st.draft.tokens, made["tokens"]), (new_out[0], out[0])):
        assert now is not before and torch.equal(now, before)
        assert now.untyped_storage().data_ptr() != before.untyped_storage().data_ptr()


def test_static_addresses_are_marked_on_cuda_only():
    t = torch.zeros(3)
    assert mark_static_addresses([t], "cpu") == 0 and not hasattr(t, "_dynamo_static_input_type")
    if torch.cuda.is_available():
        c = torch.zeros(3, device="cuda")
        assert mark_static_addresses([c, c], "cuda") == 1
        assert c._dynamo_static_input_type == "unguarded"
