"""Evaluation of trained models: few-shot linear evaluation and linear probes (Sec. 4.1)."""
