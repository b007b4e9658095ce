"""Live preview (samplers/preview.py): never changes the tokens, shows the committed part of the
image with the rest grey, throttles itself, and reaches ComfyUI's progress bar from the node."""
import json
import time

import numpy as np
import pytest
import torch

import specar
from specar.samplers.preview import PartialImage
from specar.model_loaders.tiny import tiny_model
from support.calls import generate_kwargs


class EveryStep(PartialImage):
    """A preview at every step (the real one is throttled)."""

    def due(self):
        return True


def _model():
    m = tiny_model(64, (4, 6), seed=3, row_end=True)
    m.random_drafter_seed = 0
    return m


@pytest.mark.parametrize("backend,params", [("ar", {}), ("sjd_pac", dict(window=4, tree_depth=2)),
                                            ("hawk", dict(node_budget=6)), ("adt_tree", dict(node_budget=6))])
def test_preview_never_changes_the_tokens(backend, params):
    model = _model()
    shots = []
    pv = EveryStep(model, lambda images, committed, total: shots.append((images, committed, total)), overlay=True)
    with_preview = specar.generate(model, "x", **generate_kwargs(backend=backend, preview=pv, **params), seed=4,
                                   batch_size=2)
    without = specar.generate(model, "x", **generate_kwargs(backend=backend, **params), seed=4, batch_size=2)
    assert torch.equal(with_preview.tokens, without.tokens)
    assert len(shots) == with_preview.stats.nfe  # one per decode step (the last read ends the loop)
    committed = [c for _, c, _ in shots]
    assert committed == sorted(committed) and committed[0] >= 2 and shots[0][2] == 2 * 24
    assert all(len(images) == 2 for images, _, _ in shots)


def test_uncommitted_tokens_are_grey():
    model = _model()
    seen = {}

    class Capture(EveryStep):
        def __call__(self, seq, done, at_step=None):
            seen.setdefault("done", done.clone())
            super().__call__(seq, done, at_step)

    shots = []
    specar.generate(model, "x", backend="ar", seed=1,
                    options=dict(preview=Capture(model, lambda i, c, t: shots.append(i[0]))))
    import numpy as np
    first = np.asarray(shots[0])  # no decoder: one pixel per token, codes as grey levels
    pos = model.geometry.image_positions()
    committed = (pos < int(seen["done"][0])).view(4, 6).numpy()
    assert committed.sum() == 1 and (first[~committed] == 128).all()


def test_throttle_waits_in_proportion_to_the_decode_time(monkeypatch):
    model = _model()
    pv = PartialImage(model, lambda *a: time.sleep(0.02), min_interval_s=0.0, share=0.05)
    seq = torch.zeros(1, model.geometry.seq_len, dtype=torch.long)
    t0 = time.perf_counter()
    pv(seq, torch.tensor([3]))
    spent = time.perf_counter() - t0
    assert not pv.due()  # the next preview waits at least spent / share (>= 0.4 s here)
    assert pv.next_at - time.perf_counter() >= spent / 0.05 - spent - 0.05
    with pytest.raises(ValueError, match="share must be in"):
        PartialImage(model, print, share=1.5)


def test_the_sampler_node_sends_previews_through_comfyuis_progress_bar(monkeypatch):
    import sys

    from specar.nodes import core, v1
    from support import comfy_stubs as stubs
    state = {"interrupt": False, "progress": [], "loaded": []}
    for name, module in stubs.stub_modules(state, "/nonexistent").items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(core, "PartialImage", EveryStep)
    from support import workflows
    model = _model()
    for mode, want in (("image", True), ("image + acceptance", True), ("off", False)):
        state["previews"] = []
        values = {**workflows.sampler_values("x", 0, backend="sjd_pac", preview=mode), "sjd_pac_window": 4}
        out = v1.SpecARSampler().sample(model=model, **values)
        assert bool(state["previews"]) == want, mode
        if want:  # the last preview is the finished image (what stays on the node), not a partial one
            image = out["result"][0] if isinstance(out, dict) else out[0]
            last = torch.tensor(np.array(state["previews"][-1][1].convert("RGB")), dtype=torch.float32) / 255
            assert torch.allclose(last, image[0], atol=1 / 255), mode
        for kind, image, size in state["previews"]:
            assert kind == "JPEG" and size == core.ComfyProgress.PREVIEW_SIZE and image.size == (6, 4)
        stats = json.loads((out["ui"] if isinstance(out, dict) else {"specar_stats": [out[2]]})["specar_stats"][0])
        assert stats["image_size"] == "6x4"
        if want:  # the size ComfyUI's server shows the preview at (ImageOps.contain), named with the real one
            from PIL import ImageOps
            side = core.ComfyProgress.PREVIEW_SIZE
            shown = ImageOps.contain(state["previews"][-1][1], (side, side)).size
            assert stats["preview_label"] == f"live preview: the 6x4 image, shown upscaled to {shown[0]}x{shown[1]}"
        else:
            assert "preview_label" not in stats
