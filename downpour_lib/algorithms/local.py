"""Plain single-process training: the reference every distributed algorithm is compared against."""

from __future__ import annotations

from ..options import LocalOptions
from .base import Algorithm


class Local(Algorithm):
    name = "local"
    Options = LocalOptions
