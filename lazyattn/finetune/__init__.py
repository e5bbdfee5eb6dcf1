"""`lazyattn finetune`: adapt an ordinary checkpoint to block attention (docs/finetune.md)."""
