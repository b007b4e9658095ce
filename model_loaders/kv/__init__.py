"""The static per-row slot KV cache that every adapter drives: the cache itself (`store`, and
`transformers_cache`, its form as a transformers ``Cache``), the slot layout of prompts and draft trees
(`slots`) and the start / forward / commit built on them (`slot_model`)."""
