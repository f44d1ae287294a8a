#pragma once
/// Tensor tables of published models, for simulations: each tensor's name and shape as the
/// model's checkpoint has them (from the models' published configurations), in bf16 or fp8
/// (linear weights in fp8 with one fp32 scale per 128x128 block, as DeepSeek-V3 and Kimi-K2 ship;
/// embeddings, norms and the output head in bf16).
#include <optional>
#include <string>
#include <vector>

#include "actors/tensor.hpp"

namespace ferry {

/// "llama3-8b", "qwen3-235b", "deepseek-v3", "kimi-k2"; nullopt for another name.
std::optional<std::vector<tensor_spec>> model_preset(const std::string& name, bool fp8);
std::vector<std::string> model_preset_names();

}  // namespace ferry
