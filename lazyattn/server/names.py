"""What `lazyattn serve` (server/cli.py) and the Ray Serve application (cluster/app.py) read the same way from
their options: the prompt layout's name and the model id clients send. Kept apart from both, so that neither
imports the other."""

from __future__ import annotations

from pathlib import Path

# --prompt-layout names -> lazyattn.engine.prompt layouts (resolved at start: importing them here would load
# the engine for every CLI command).
LAYOUTS = {"block-attention": "DEFAULT_LAYOUT", "tulu3-block-ft": "TULU3_BLOCK_FT_LAYOUT"}


def served_model_name(model: str) -> str:
    """The model id clients send when --served-model-name is not given."""
    return model if model == "tiny" else Path(model).resolve().name
