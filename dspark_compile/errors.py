"""Typed errors: each names what was wrong and what is allowed."""


class DSparkError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(DSparkError, ValueError):
    """An unknown lane or backend, or a lane whose fields contradict each other."""


class InputError(DSparkError, ValueError):
    """A draft-step input with the wrong shape, dtype, device or value range."""

    def __init__(self, field: str, problem: str, allowed: str):
        self.field = field
        super().__init__(f"{field}: {problem}; allowed: {allowed}")


class CheckpointError(DSparkError, ValueError):
    """A checkpoint whose config, keys or shapes do not match the lane."""


class ArtifactError(DSparkError, RuntimeError):
    """An artifact that is missing, partial, corrupted, or from another environment."""


class ChecksumError(DSparkError, ValueError):
    """Bytes that do not match the sha256 recorded for them."""


class MissingBackendError(DSparkError, ImportError):
    """A backend whose package is not installed; the message gives the install command."""


class RunnerBusyError(DSparkError, RuntimeError):
    """A Runner called from a second thread while a call is running."""
