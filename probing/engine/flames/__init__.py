"""Flame graphs: stacks sampled over a window, module times from python.torch_trace, and
every rank's side by side."""
