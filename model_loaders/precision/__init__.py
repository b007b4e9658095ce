"""How the target computes in lower precision: weight-only int8 / int4 quantization (`quantize`) and the
batch-invariant forwards that keep half precision's images the same as AR's (`batch_invariant`)."""
