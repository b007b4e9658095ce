"""The model families' adapters (each module ending in `FAMILY = ModelFamily(...)` is one the registry lists),
their image tokenizers (VQ decoders) and the decoders and adapter bases they share: our Llama (`llama`,
`llama_adapter`) and the transformers adapter base (`hf_common`)."""
