"""The backend registry (samplers/backends.py): the schema derived from each method's typed
parameters, one validation, and the fields marked as sizing the draft tree."""
import dataclasses

import pytest

from specar.samplers.backends import METHODS, SCHEMAS, make_backend
from specar.samplers.target import SamplingParams
from specar.model_loaders.tiny import tiny_model


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_the_schema_is_the_typed_parameters(method):
    schema = SCHEMAS[method.name]
    fields = dataclasses.fields(method.params_type)
    assert [(p.name, p.default) for p in schema.params] == [(f.name, f.default) for f in fields]
    config = make_backend(method.name)
    assert type(config.typed_params) is method.params_type and config.typed_params == method.params_type()
    assert config.params() == {f.name: f.default for f in fields}
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(config.typed_params, "x", 1)


def _changed(p):
    """Another allowed value of a numeric parameter."""
    step = 1 if p.kind is int else 0.05
    if p.name == "node_budget" and p.default == 0:  # 0: chosen from measured costs (at most 8 until timed); 1 refused
        return 2
    return p.default + step if p.hi is None or p.default + step <= p.hi else p.default - step


@pytest.mark.parametrize("name", [m.name for m in METHODS])
def test_exactly_the_size_parameters_change_the_slots_per_forward(name):
    """`sizes=True` marks the fields the out-of-memory messages name: changing one of them changes
    the drafter's slots per forward (node_budget), changing any other numeric field does not."""
    model = tiny_model(8, (10, 10), seed=1)  # 100 image tokens (a window of 65 fits), 8 codes (tree_width 5)
    sampling = SamplingParams()
    schema = SCHEMAS[name]
    base = make_backend(name).make_drafter(model, sampling).node_budget
    for p in schema.params:
        if p.kind not in (int, float):
            continue
        drafter = make_backend(name, **{p.name: _changed(p)}).make_drafter(model, sampling)
        assert (drafter.node_budget != base) == p.sizes, (name, p.name, base, drafter.node_budget)
    assert schema.size_params == tuple(p.name for p in schema.params if p.sizes)


def test_checks_between_parameters_run_once_in_make_backend():
    with pytest.raises(ValueError, match=r"tree_depth must be an int in \[1, 2\], got 3"):
        make_backend("sjd_pac", window=2, tree_depth=3)
    with pytest.raises(ValueError, match="needs candidate_mode=sampled"):
        make_backend("adt_tree", tree_shape="best_first", candidate_mode="topk")
    with pytest.raises(ValueError, match="needs candidate_mode=topk"):
        make_backend("adt_tree", relaxed=True)
    assert make_backend("spatial", window=3, tree_depth=3).typed_params.tree_depth == 3
