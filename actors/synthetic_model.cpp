#include "actors/synthetic_model.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

namespace ferry {
namespace {

struct shape {
  std::int64_t vocab, hidden, kv, ffn, layers;
};

std::vector<tensor_spec> transformer(const shape& s) {
  std::vector<tensor_spec> out;
  auto add = [&](std::string name, std::vector<std::int64_t> dims) {
    out.push_back(make_tensor_spec(std::move(name), dtype::bf16, std::move(dims)));
  };
  add("model.embed_tokens.weight", {s.vocab, s.hidden});
  for (std::int64_t i = 0; i < s.layers; ++i) {
    const auto p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {s.hidden});
    add(p + "self_attn.q_proj.weight", {s.hidden, s.hidden});
    add(p + "self_attn.k_proj.weight", {s.kv, s.hidden});
    add(p + "self_attn.v_proj.weight", {s.kv, s.hidden});
    add(p + "self_attn.o_proj.weight", {s.hidden, s.hidden});
    add(p + "post_attention_layernorm.weight", {s.hidden});
    add(p + "mlp.gate_proj.weight", {s.ffn, s.hidden});
    add(p + "mlp.up_proj.weight", {s.ffn, s.hidden});
    add(p + "mlp.down_proj.weight", {s.hidden, s.ffn});
  }
  add("model.norm.weight", {s.hidden});
  add("lm_head.weight", {s.vocab, s.hidden});
  return out;
}

/// Llama's FFN width: 8/3 of hidden, rounded up to a multiple of 64.
std::int64_t ffn_of(std::int64_t h) {
  return (h * 8 / 3 + 63) / 64 * 64;
}

std::uint64_t layer_bytes(std::int64_t h) {
  const std::int64_t ffn = ffn_of(h);
  return 2 * static_cast<std::uint64_t>(2 * h * h + 2 * (h / 4) * h + 3 * ffn * h + 2 * h);
}

}  // namespace

std::vector<tensor_spec> synthetic_transformer(std::uint64_t target_bytes) {
  // The widest power-of-two hidden size that still leaves room for 8 layers; the vocabulary
  // shrinks for tiny models so the embeddings stay a fraction of the bytes.
  auto vocab_for = [&](std::int64_t h) {
    return std::clamp<std::int64_t>(static_cast<std::int64_t>(target_bytes / 8 / (4 * h)), 16,
                                    32000);
  };
  auto fits = [&](std::int64_t h) {
    return 4ull * vocab_for(h) * h + 8 * layer_bytes(h) <= target_bytes;
  };
  std::int64_t h = 64;
  while (h < 8192 && fits(2 * h)) h *= 2;
  const std::int64_t vocab = vocab_for(h);
  const std::uint64_t embeddings = 4ull * vocab * h;
  const std::int64_t layers = std::max<std::int64_t>(
      1, static_cast<std::int64_t>((target_bytes - std::min(target_bytes, embeddings)) /
                                   layer_bytes(h)));
  return transformer(
      {.vocab = vocab, .hidden = h, .kv = h / 4, .ffn = ffn_of(h), .layers = layers});
}

std::vector<tensor_spec> llama3_8b() {
  return transformer({.vocab = 128256, .hidden = 4096, .kv = 1024, .ffn = 14336, .layers = 32});
}

std::vector<std::vector<tensor_spec>> split_over_shards(const std::vector<tensor_spec>& model,
                                                        std::uint32_t shards) {
  // Contiguous ranges of the model, cut where a shard reaches its share of the bytes.
  std::uint64_t total = 0;
  for (const auto& t : model) total += t.nbytes;
  std::vector<std::vector<tensor_spec>> out(std::max(1u, shards));
  std::uint64_t so_far = 0;
  for (const auto& t : model) {
    const auto shard = std::min<std::uint64_t>(
        out.size() - 1, so_far * out.size() / std::max<std::uint64_t>(total, 1));
    out[shard].push_back(t);
    so_far += t.nbytes;
  }
  return out;
}

void fill_version(std::span<std::byte> bytes, std::string_view name, std::uint64_t version) {
  // xorshift words seeded by (name, version): fast, and no two tensors or versions alike.
  std::uint64_t x = XXH3_64bits_withSeed(name.data(), name.size(), version) | 1;
  std::size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(bytes.data() + i, &x, 8);
  }
  for (; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(x >> (8 * (i % 8)));
}

}  // namespace ferry
