"""probing: a debugger for live Python processes, above all PyTorch training jobs.

This module stays import-free: the agent loads the package inside the target process,
where nothing heavy may be imported at start.
"""

__version__ = "0.1.0"
