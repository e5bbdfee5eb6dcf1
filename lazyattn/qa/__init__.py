"""Question-answering items (the JSONL format and how a run arranges documents) and the synthetic set made here.

A floor below `eval/` and `finetune/`, which both read them: evaluation scores runs on them, fine-tuning draws its
labelled rows from the synthetic set's train split.
"""
