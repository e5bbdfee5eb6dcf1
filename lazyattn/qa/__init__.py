"""Question-answering items (the JSONL format and how a run arranges documents), the synthetic set made here, and
labelled texts read from translation catalogues.

A floor below `eval/` and `finetune/`, which both read them: evaluation scores runs on them, fine-tuning draws its
labelled rows from the synthetic set's train split, and both make few-shot prompts from catalogue messages.
"""
