"""The version of vitlab, in one place: the package, the CLI, saved checkpoints and the build
(``pyproject.toml`` reads it from here) import it without importing the package root."""

__version__ = "0.2.0"
