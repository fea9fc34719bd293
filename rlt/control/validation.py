"""Moved to rlt/validation.py (both the coordinator and the workers import it); kept importable."""

from rlt.validation import *  # noqa: F403
