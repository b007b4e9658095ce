"""The command-line tools of `python -m specar <command>` (one module per command):

- demo.py: `demo` (make demo): the demo model, AR vs the fastest lossless backend
- benchmark.py: `bench` (make bench): every backend side by side in one run
- evaluate_demo.py: `evaluate-demo`: prompt following of the demo model (16 judged prompts)
- shape_bench.py: `shape-bench`: 7B-shape forward latency vs the sampling core's cost
"""
