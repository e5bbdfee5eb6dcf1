from tests.engine.conftest import checkpoint  # noqa: F401 (the small checkpoints with a tokenizer)
