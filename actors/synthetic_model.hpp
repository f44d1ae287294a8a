#pragma once
/// Synthetic models whose tensor lists look like real transformers', with deterministic bytes
/// per version, for the demo, the tests and the benchmarks.
#include <cstdint>
#include <span>
#include <vector>

#include "actors/tensor.hpp"

namespace ferry {

/// A Llama-shaped bf16 model of about `target_bytes`: embedding, layers of q/k/v/o and
/// gate/up/down projections with their norms, final norm, lm_head.
std::vector<tensor_spec> synthetic_transformer(std::uint64_t target_bytes);

/// Llama-3-8B in bf16 (vocab 128256, hidden 4096, 32 layers, 8 KV heads, FFN 14336): ~16 GB.
std::vector<tensor_spec> llama3_8b();

/// Splits `model` over `shards` trainer shards, balancing bytes; each shard keeps model order.
std::vector<std::vector<tensor_spec>> split_over_shards(const std::vector<tensor_spec>& model,
                                                        std::uint32_t shards);

/// Fills `bytes` with the content of tensor `name` at `version`: deterministic, different for
/// every tensor and version. Thread-safe.
void fill_version(std::span<std::byte> bytes, std::string_view name, std::uint64_t version);

}  // namespace ferry
