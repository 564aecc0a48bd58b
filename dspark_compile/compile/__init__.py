"""Compiling the draft step into cached artifacts: the backends, the artifact key, the store
and the build."""

from dspark_compile.compile.build import build_artifact

__all__ = ["build_artifact"]
