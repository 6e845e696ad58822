"""The errors a user can cause, in one place: each message names what is wrong and how to fix it. The CLI prints
them as `error: …` (exit code 2) and the pages show them in a box, instead of a traceback."""

from __future__ import annotations


class WorkbenchError(ValueError):
    """Bad input from the user (a file, a value, a model, a run); the message says what to do."""


class DataError(WorkbenchError):
    """Bad input data: the message names the row/field that is wrong and how to fix it."""


class ModelError(WorkbenchError):
    """A model cannot be loaded or does not fit the request; the message says what to do."""


class ConfigError(WorkbenchError):
    """An invalid configuration value; the message names the field, the value and the fix."""


class RunError(WorkbenchError):
    """A run directory is missing, incomplete, corrupt or does not match the model; the message says what to do."""


class ScorerError(WorkbenchError):
    """A scorer cannot be built or used as asked; the message says what to do."""


class ServiceError(WorkbenchError):
    """An outside service (a tracking server, a hub, a cluster) is not reachable; the message names it, the setting
    that named it and the fix."""


class JobError(RuntimeError):
    """A job cannot be launched, resumed or cancelled; the message says why and what to do."""
