"""Errors shared across layers (a leaf module: imports nothing from gdpo_jax)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config field is invalid; the message names the field and the fix."""
