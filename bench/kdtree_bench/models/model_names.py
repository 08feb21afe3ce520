"""What records call a model that ``make_model.py`` wrote, read from its config.json. Torch-free,
so that the tools which only read configs (``sglang_e2e.py``, ``merge_e2e.py``) import fast."""

from __future__ import annotations

from typing import Any


def made_model_name(config: dict[str, Any], fallback: str) -> str:
    """The name (``make_model.model_name``) in the config.json of a model ``make_model.py``
    wrote; ``fallback`` for any other model. Models written before names existed carry only
    their preset."""
    made = config.get("kdtree_model", {})
    return made.get("name", made.get("preset", fallback))
