// Package model runs the forward pass of Llama-family transformers (llama,
// and qwen2 with attention biases) over a batch of sequences at different
// positions in one step.
//
// The forward pass reads and writes keys and values only through
// *kvcache.View values, which the page pool hands out after checking that
// every page of the sequence belongs to it (invariants I2 and I3 of
// DESIGN.md). The model itself holds no per-sequence state, so one Model
// serves any number of tenants concurrently as long as each step's views are
// disjoint.
//
// Weights come from GGUF files (memory-mapped), llama2.c checkpoints, or the
// built-in generator (builtin:tiny), all through the same Load path.
package model
