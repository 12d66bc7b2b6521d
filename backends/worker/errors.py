"""The worker's errors; each message says what to change."""

from __future__ import annotations


class WorkerError(Exception):
    """Base of every error the PyTorch worker raises."""


class ModelFormatError(WorkerError, ValueError):
    """A checkpoint is malformed or describes a model this worker does not run."""

