"""What runs the engine's decode step besides the loop (samplers/engine.py):

- step_graphs.py: compile=True, the step as one compiled graph per plan with its random draws replayed
- shape_compiled.py: torch.compile of one function, one graph per shape key, counted; its settings
- few_rows_matmul.py: the CPU graph's products of a few rows as a multiply-and-sum
- graph_buffers.py: CUDA graphs' static addresses, copies of a replay's outputs, buffer homes
"""
