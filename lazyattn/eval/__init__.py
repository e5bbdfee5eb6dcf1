"""Answer quality per attention mode: a RAG question-answering harness (`lazyattn eval`, docs/quality.md).

- `dataset`: the JSONL item format, reading/writing it, and choosing and ordering each item's documents
  (how many, where the gold ones go).
- `synthetic`: the built-in evaluation set, generated from a seed about fictional entities.
- `metrics`: accuracy (answer contained in the output), exact match and token F1, SQuAD-normalised.
- `harness`: runs items through one engine per mode and scores them; `report`: tables, JSON, plot.
- `fidelity`: how far the arithmetic moves answers (dtypes, batch sizes, modes); `fidelity_cli`: `--fidelity`.
- `cli`: `lazyattn eval`'s parser and the accuracy run; `inputs`: what both runs read from the command line.
"""
