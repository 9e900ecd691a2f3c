"""User-facing errors. The CLI prints their message on one line and exits non-zero."""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "InputError",
    "NonFiniteLossError",
    "OfflineError",
    "OutputError",
    "UnknownModelError",
    "VitlabError",
]


class VitlabError(Exception):
    """Base of every error whose message is meant for the user as-is."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ConfigError(VitlabError, ValueError):
    """An invalid option; the message names it. Made by :meth:`at`, it also says which option and what is wrong
    apart (``option``, ``problem``), so that a caller can name the option in its own terms (a command-line
    flag, a config file's key) without taking the message apart."""

    option: str | None = None
    problem: str | None = None

    @classmethod
    def at(cls, option: str, problem: str, *, python: str = "") -> ConfigError:
        """``"{option}: {problem}{python}"``, with ``option`` and ``problem`` kept; ``python`` is a remedy only a
        Python caller has (a keyword argument no command-line flag sets), so it is in the message but not in
        ``problem``, which a command line renders under its own flag."""
        e = cls(f"{option}: {problem}{python}")
        e.option, e.problem = option, problem
        return e


class InputError(VitlabError, ValueError):
    """Input tensors or images the model cannot take (channels, size)."""


class UnknownModelError(VitlabError, KeyError):
    """A model name that is not registered; the message suggests close names."""


class CheckpointError(VitlabError, ValueError):
    """A file that is not a checkpoint, or one that does not fit the model."""


class OfflineError(VitlabError, OSError):
    """A download was needed but the network (or the file) is unreachable."""


class OutputError(VitlabError, OSError):
    """An output vitlab cannot write where it was asked to: a full disk, a read-only folder, a folder where a
    file goes (or a file where a folder goes). The message names the path and says what was kept; ``errno``
    and ``strerror`` are the system's, when it gave them."""


class NonFiniteLossError(VitlabError, FloatingPointError):
    """A NaN or Inf training loss (``--on-nan stop``): the run stops before the bad update."""


class DataError(VitlabError, ValueError):
    """A data source that cannot be used (missing folder, no images, unreadable files with --strict-data)."""
