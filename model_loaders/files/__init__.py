"""Reading model and drafter files: safe checkpoint loading (`checkpoints`), transformers folders (`hf_files`),
the local Hugging Face cache (`hub_cache`), drafter files (`drafter_files`) and the weights fingerprint that
ties a drafter to its target (`fingerprint`)."""
