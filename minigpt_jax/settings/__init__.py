"""Declarations: every setting declared once (`groups`), and the registries that every swappable
part is picked from (`registry`). A plug-in's API is here:

    from minigpt_jax.settings import MODEL, TRAJECTORY, declares, options_of, setting
"""

from minigpt_jax.settings.groups import (
    BOOKKEEPING,
    MODEL,
    SPEED,
    TRAJECTORY,
    Setting,
    options_of,
    setting,
)
from minigpt_jax.settings.registry import Registry, declares

__all__ = [
    "BOOKKEEPING",
    "MODEL",
    "SPEED",
    "TRAJECTORY",
    "Registry",
    "Setting",
    "declares",
    "options_of",
    "setting",
]
