"""Sequence parallelism in Relax: a scan split across ranks (``scan``: summarize, one
all-gather, finish; what a part tells the others per form: ``summaries``) and the pass that
splits a model's prefill (``sequence``)."""
