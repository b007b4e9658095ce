"""The walk over a step's state that the CUDA-graph path uses (model_loaders/capture.py,
samplers/compiled_step/graph_buffers.py): which tensors a
step kept (static addresses for CUDA graphs) and copies of what it made (a CUDA graph's outputs are
overwritten by its next replay). Checked on the CPU; docs/BENCHMARKS.md "GPU check" has the GPU runs."""
from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch

import specar
from specar.model_loaders import capture as capture_mod
from specar.model_loaders.capture import mark_static_addresses, reachable_tensors, tensor_paths
from specar.samplers import engine as engine_mod
from specar.samplers.compiled_step import graph_buffers as graph_buffers_mod
from specar.samplers.compiled_step import shape_compiled as compiled_mod
from specar.samplers.compiled_step import step_graphs as step_graphs_mod
from specar.samplers.compiled_step.graph_buffers import BufferHomes, copy_graph_outputs
from support.exactness import reused_cache_differences, tiny_model
from support.calls import generate_kwargs

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


# -- the CUDA-graph precondition, checked on the CPU ------------------------------------------------------
# CUDA graph trees fix a graph's static inputs when it is compiled (the inputs marked then), skip the graph
# if it writes an input that is not static, and re-record it whenever a static input moves. With the
# CUDA-graph handling switched on for the CPU (capture.GRAPH_BUFFERS_ON_CPU), every compiled decode step is
# watched: at the step that compiles a plan's graph, everything the step writes in place must be marked;
# and in that generation the marked tensors of the plan must stay where they were from step to step. (A
# later generation's buffers are new: the graph records once more with them, run 2 of docs/BENCHMARKS.md
# "GPU check".)

class StepWatch:
    def __init__(self, monkeypatch):
        self.unmarked_writes, self.moved, self.compiles = [], [], 0
        self.seen, self.static = set(), {}
        # across generations: per key, the addresses of its static paths when it compiled; later generations'
        # compiled steps whose static buffers are elsewhere (a CUDA graph would record again), and how many ran
        self.home_ptrs, self.rerecorded, self.later_steps = {}, [], 0
        original = compiled_mod.ShapeCompiled.__call__
        watch = self

        def call(compiled, key, *args):
            if compiled.name != "decode step":
                return original(compiled, key, *args)
            run, plan, state, session, at_step, drawn = args
            paths = tensor_paths(state, session, at_step)
            before = {id(t): t for t in paths.values()}  # (reachable_tensors: the same walk)
            static_paths = step_graphs_mod._STEP_GRAPHS[state.ctx.model].static_paths.get(key, set())
            ptrs = {p: t.data_ptr() for p, t in paths.items() if p in static_paths}
            compiling = key not in watch.seen
            if compiling:
                watch.seen.add(key)
                watch.static[key] = (state, sorted(t.data_ptr() for t in before.values() if _marked(t)))
                watch.home_ptrs[key] = ptrs
                values = {i: t.clone() for i, t in before.items()}
            elif watch.static[key][0] is state:  # the generation that compiled it
                if sorted(t.data_ptr() for t in before.values() if _marked(t)) != watch.static[key][1]:
                    watch.moved.append(key)
            else:  # a later generation: its buffers in the homes the graph was recorded with
                watch.later_steps += 1
                if ptrs != watch.home_ptrs[key]:
                    watch.rerecorded.append(key)
            out = original(compiled, key, *args)
            if compiling:
                watch.compiles += 1
                for i, t in before.items():
                    if not _marked(t) and not torch.equal(t, values[i]):
                        watch.unmarked_writes.append((key, tuple(t.shape), str(t.dtype)))
            return out

        monkeypatch.setattr(compiled_mod.ShapeCompiled, "__call__", call)
        monkeypatch.setattr(capture_mod, "GRAPH_BUFFERS_ON_CPU", True)


_marked = capture_mod.is_static_address


GRAPH_CASES = [
    ("ar", {}),
    ("scd", dict(window=3)),
    ("sjd_pac", dict(window=3, tree_depth=2, tree_width=2, reproducible=False)),
    ("hawk", dict(node_budget=8)),
    ("auto", dict(max_window=4, cost_model="forwards")),
    ("adt_tree", dict(node_budget=6)),
    ("spatial", {}),
]


def _watched_generations(monkeypatch, backend, params, seeds=(21, 22, 23)):
    kw = dict(vocab_size=16, grid=(4, 4), seed=5, row_end=True)
    eager, comp = tiny_model(**kw), tiny_model(**kw)
    watch = StepWatch(monkeypatch)
    handed_out = []  # every generation's tokens as returned, and a copy taken then
    for seed in seeds:
        args = dict(backend=backend, seed=seed, batch_size=2, cfg_scale=2.0, **params)
        got = specar.generate(comp, "a cat", **generate_kwargs(compile=True, **args))
        want = specar.generate(eager, "a cat", **generate_kwargs(**args))
        assert torch.equal(got.tokens, want.tokens), backend  # copies change nothing
        handed_out.append((got.sequence, got.sequence.clone()))  # (the tokens are a gather: a copy anyway)
    watch.overwritten = [i for i, (now, then) in enumerate(handed_out) if not torch.equal(now, then)]
    return watch


def _check_watch(watch):
    assert watch.compiles > 0 and watch.later_steps > 0
    assert watch.unmarked_writes == [] and watch.moved == []
    assert watch.rerecorded == []  # later generations: every static buffer where its graph was recorded
    assert watch.overwritten == []  # a generation's tokens are its own, whatever runs after it


@pytest.mark.parametrize("backend,params", GRAPH_CASES[:2], ids=[c[0] for c in GRAPH_CASES[:2]])
def test_compiled_steps_write_only_static_buffers(monkeypatch, backend, params):
    _check_watch(_watched_generations(monkeypatch, backend, params))


@pytest.mark.long
@pytest.mark.parametrize("backend,params", GRAPH_CASES[2:], ids=[c[0] for c in GRAPH_CASES[2:]])
def test_every_backend_writes_only_static_buffers(monkeypatch, backend, params):
    _check_watch(_watched_generations(monkeypatch, backend, params))


def test_the_watch_catches_unmarked_writes(monkeypatch):
    # planted: no marks when a graph compiles (the first GPU run): the step's in-place writes are unmarked
    monkeypatch.setattr(step_graphs_mod, "set_static_addresses", lambda paths, static, device: None)
    assert _watched_generations(monkeypatch, "scd", dict(window=3), seeds=(21,)).unmarked_writes


def test_the_watch_catches_static_inputs_that_move(monkeypatch):
    # planted: mark everything the step takes, its outputs too: those move at every step
    monkeypatch.setattr(step_graphs_mod, "set_static_addresses", lambda paths, static, device:
                        graph_buffers_mod.set_static_addresses(paths, set(paths), device))
    assert _watched_generations(monkeypatch, "scd", dict(window=3), seeds=(21,)).moved


def test_the_watch_catches_buffers_that_leave_their_homes(monkeypatch):
    # planted: no homes (each generation's own buffers, the GPU runs' re-record per generation)
    monkeypatch.setattr(BufferHomes, "settle", lambda homes, paths, static: 0)
    assert _watched_generations(monkeypatch, "scd", dict(window=3), seeds=(21, 22)).rerecorded


def test_the_watch_catches_tokens_handed_out_from_a_home(monkeypatch):
    # planted: the engine hands out a view of its sequence, which lives in a home the next generation overwrites
    monkeypatch.setattr(engine_mod.SpeculativeEngine, "_tokens_out",
                        lambda engine, state: state.seq[:, : engine.ctx.model.geometry.seq_len])
    assert _watched_generations(monkeypatch, "ar", {}, seeds=(21, 22)).overwritten == [0]


@pytest.mark.long  # four compiled generations over two backends: make test-long
def test_the_model_keeps_the_homes_of_the_backend_it_runs_now(monkeypatch):
    """Homes the last generation did not use are let go: switching backends does not pile up KV caches."""
    monkeypatch.setattr(capture_mod, "GRAPH_BUFFERS_ON_CPU", True)
    model = tiny_model(vocab_size=16, grid=(4, 4), seed=5, row_end=True)
    runs = [("scd", dict(window=3)), ("ar", {}), ("scd", dict(window=3)), ("ar", {})]
    held = []
    for seed, (backend, params) in enumerate(runs):
        specar.generate(model, "a cat", **generate_kwargs(backend=backend, compile=True, **params), seed=seed)
        homes = step_graphs_mod._STEP_GRAPHS[model].homes
        held.append({k[:2]: h.data_ptr() for k, h in homes.homes.items()})  # (path, shape) -> address
    assert set(held[0]) == set(held[2]) and set(held[1]) == set(held[3])  # the same homes per backend
    assert not set(held[0]) & set(held[1])  # nothing of scd's is held while AR runs (its cache is wider too)
    assert any("cache" in path for path, shape in held[1])  # the KV cache has a home


# -- BufferHomes on its own -------------------------------------------------------------------------------

def _homes_with(path, t):
    homes = BufferHomes()
    homes.begin()
    assert homes.settle({path: t}, {path}) == 0  # no home yet: t becomes it
    return homes


def test_a_buffer_moves_into_its_home_with_its_values():
    home = torch.zeros(2, 3)
    homes = _homes_with(("seq",), home)
    new = torch.arange(6.0).view(2, 3).clone()
    alias = new  # another reference to the same tensor object sees the home too
    assert homes.settle({("seq",): new}, {("seq",)}) == 1
    assert new.data_ptr() == home.data_ptr() and alias.data_ptr() == home.data_ptr()
    assert torch.equal(home, torch.arange(6.0).view(2, 3))
    assert homes.settle({("seq",): new}, {("seq",)}) == 0  # already home
    assert homes.settle({("seq",): torch.ones(2, 3)}, set()) == 0  # not a static path of this graph: left
    other = torch.zeros(3, 2)  # another shape at that path: its own home
    assert homes.settle({("seq",): other}, {("seq",)}) == 0 and other.data_ptr() != home.data_ptr()
    homed = list(homes.homes.values())
    assert len(homed) == 1 and homed[0] is other  # one home per path: the new shape's replaces the old


def test_views_bases_and_busy_homes_stay_where_they_are():
    home = torch.zeros(4)
    homes = _homes_with(("a",), home)
    a = {("a",)}
    base = torch.ones(8)
    view = base[:4]  # a view: not the whole of its storage
    assert homes.settle({("a",): view}, a) == 0
    own = torch.ones(4)
    assert homes.settle({("a",): own, ("b",): own.view(2, 2)}, a) == 0  # a base with a view reachable
    assert homes.settle({("a",): torch.ones(4), ("b",): home}, a) == 0  # the home is still in use
    homes.begin()  # a second generation in flight: both would write the one home
    assert homes.settle({("a",): own}, a) == 0
    homes.end()
    assert homes.settle({("a",): own}, a) == 1


def test_homes_a_generation_did_not_use_are_let_go():
    homes = _homes_with(("a",), torch.zeros(4))
    homes.end()
    homes.begin()
    homes.settle({("b",): torch.zeros(2)}, {("b",)})  # this generation's graphs use ("b",) only
    homes.end()
    assert [k[0] for k in homes.homes] == [("b",)]
    homes.begin()  # a generation with no compiled step (all eager) lets nothing go
    homes.end()
    assert [k[0] for k in homes.homes] == [("b",)]


# -- the KV cache: one per model on the CUDA-graph path (slot_model._session_cache) ------------------------

@pytest.mark.long  # compiled generations: make test-long
def test_the_kv_cache_is_made_once_and_reused_unseen(monkeypatch):
    model = tiny_model(vocab_size=16, grid=(4, 4), seed=5, row_end=True)
    assert reused_cache_differences(model, ["a cat", "a much longer prompt about a dog", "x"]) == ([], True)
    made = []
    new_cache = model._new_cache
    monkeypatch.setattr(model, "_new_cache", lambda rows, capacity: made.append(rows) or new_cache(rows, capacity))
    monkeypatch.setattr(capture_mod, "GRAPH_BUFFERS_ON_CPU", True)
    per_generation = []
    for seed in (1, 2, 3, 4):
        specar.generate(model, "a cat", backend=specar.make_backend("scd", window=3), seed=seed,
                        options=dict(compile=True), sampling=dict(cfg_scale=2.0))
        per_generation.append(len(made))
    # the generation that compiles the graphs stays referenced by dynamo's trace (a LazyCache) until a later
    # call: the next one makes its own cache (moved into the homes); from then on, one cache
    assert per_generation[0] == 1 and per_generation[1] <= 2 and per_generation[3] == per_generation[1]


def test_a_cache_a_live_session_uses_is_not_handed_to_another(monkeypatch):
    model = tiny_model(vocab_size=16, grid=(4, 4), seed=5, row_end=True)
    monkeypatch.setattr(capture_mod, "GRAPH_BUFFERS_ON_CPU", True)
    start = lambda: model.start(model.encode_prompt("a cat"), 1, True, draft_capacity=2, captured=True)  # noqa
    with torch.inference_mode():
        first = start()
        second = start()  # `first` is alive: its cache is its own
        assert second.state.cache is not first.state.cache
        cache = second.state.cache
        del second
        assert start().state.cache is cache  # `second` ended: the next session takes its cache
    monkeypatch.setattr(capture_mod, "GRAPH_BUFFERS_ON_CPU", False)
    with torch.inference_mode():
        assert start().state.cache is not cache  # off the CUDA-graph path: every session its own
