"""The maintainers' folder (not in the wheel; the product never imports it): their commands, `python -m specar.tooling
<command>`, the measurements behind docs/ and the GPU check; scripts run by path; their tests in tooling/tests/ (run
by `make test`). Modules may exceed the product's 400 lines.

- gpu_check/: `gpu-check`, the CUDA path in one command: the command and its plan (__init__.py, plan.py), the
  isolated stage runner (runner.py), the stages (stages.py and one module each), the report (report.py), the
  roofline refit (refit.py)
- real_size.py, real_size_builders.py: `real-size`, every family at a released checkpoint's widths;
  released_models.py: the released 7-8B models gpu-check's images stage generates with
- shape_bench.py: `shape-bench`, 7B-shape forwards vs the sampling core (and `--roofline`: roofline.py's
  projection); shapes.py: the random-weight 7B shape it shares with gpu-check
- compile_rows.py, calibrate_regime.py, evaluate_demo.py: one measurement each; memory.py: `memory`, what a released
  checkpoint needs, computed from its configuration; step_costs.py: each backend's step shape, for roofline.py
- scripts (`python tooling/NAME.py`): doc_figures.py (the docs' figures from their JSON), half_same_image.py,
  pinned_forward_cost.py, pool_bench_runs.py, profile_step.py (measurements behind docs/),
  screenshot_nodes.py and ui_check.js (ComfyUI's frontend, headless), install_torch.py (`make demo`'s torch),
  train_demo.py (the demo model's weights from scratch; its data and codebook fit: demo_data.py)
"""
# absolute: pytest imports this file on its own too (the package of tooling/tests/, whose setup it runs)
from specar.cli.args import Commands

COMMANDS = Commands("python -m specar.tooling", __package__, {
    "gpu-check": "gpu_check", "real-size": "real_size", "shape-bench": "shape_bench",
    "compile-rows": "compile_rows", "calibrate-regime": "calibrate_regime", "evaluate-demo": "evaluate_demo",
    "memory": "memory",
}, "SpecAR's maintainer tooling: the measurements behind docs/ and the GPU check.")
main, call, parser = COMMANDS.main, COMMANDS.call, COMMANDS.parser

__all__ = ["COMMANDS", "call", "main", "parser"]
