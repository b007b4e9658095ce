"""Model loading: the contract the sampling core drives (`contract`), the registry of model families (`registry`,
`family`), the families (`families/`), the slot KV cache (`kv/`), file reading (`files/`), precision
(`precision/`) and the built-in demo model (`demo/`)."""
