"""The runtime: load an artifact and draft with one graph replay per round."""

from dspark_compile.runtime.load import load_runner
from dspark_compile.runtime.runner import Runner

__all__ = ["Runner", "load_runner"]
