#include "jobs/model_presets.hpp"

namespace ferry {
namespace {

/// Architecture figures from each model's config.json.
struct architecture {
  std::int64_t vocab, hidden, layers, heads, kv_heads, head_dim, ffn;
  std::int64_t dense_layers = 0;  ///< MoE models: the first layers keep a dense MLP
  std::int64_t experts = 0, expert_ffn = 0, shared_experts = 0;
  bool mla = false;  ///< DeepSeek's multi-head latent attention
  std::int64_t q_lora = 0, kv_lora = 0, qk_nope = 0, qk_rope = 0, v_head = 0;
  bool qk_norm = false;
};

class table {
 public:
  explicit table(bool fp8) : fp8_(fp8) {}
  void norm(const std::string& name, std::int64_t n) { add(name, dtype::bf16, {n}); }
  void plain(const std::string& name, std::vector<std::int64_t> shape) {
    add(name, dtype::bf16, std::move(shape));
  }
  /// A linear layer's weight [out, in]: fp8 with its block scales, or bf16.
  void linear(const std::string& prefix, std::int64_t out, std::int64_t in) {
    if (!fp8_) return add(prefix + ".weight", dtype::bf16, {out, in});
    add(prefix + ".weight", dtype::fp8_e4m3, {out, in});
    add(prefix + ".weight_scale_inv", dtype::f32, {(out + 127) / 128, (in + 127) / 128});
  }
  std::vector<tensor_spec> take() { return std::move(out_); }

 private:
  void add(const std::string& name, dtype t, std::vector<std::int64_t> shape) {
    out_.push_back(make_tensor_spec(name, t, std::move(shape)));
  }
  bool fp8_;
  std::vector<tensor_spec> out_;
};

std::vector<tensor_spec> build(const architecture& a, bool fp8) {
  table t(fp8);
  t.plain("model.embed_tokens.weight", {a.vocab, a.hidden});
  for (std::int64_t i = 0; i < a.layers; ++i) {
    const auto p = "model.layers." + std::to_string(i) + ".";
    t.norm(p + "input_layernorm.weight", a.hidden);
    if (a.mla) {
      t.linear(p + "self_attn.q_a_proj", a.q_lora, a.hidden);
      t.norm(p + "self_attn.q_a_layernorm.weight", a.q_lora);
      t.linear(p + "self_attn.q_b_proj", a.heads * (a.qk_nope + a.qk_rope), a.q_lora);
      t.linear(p + "self_attn.kv_a_proj_with_mqa", a.kv_lora + a.qk_rope, a.hidden);
      t.norm(p + "self_attn.kv_a_layernorm.weight", a.kv_lora);
      t.linear(p + "self_attn.kv_b_proj", a.heads * (a.qk_nope + a.v_head), a.kv_lora);
      t.linear(p + "self_attn.o_proj", a.hidden, a.heads * a.v_head);
    } else {
      t.linear(p + "self_attn.q_proj", a.heads * a.head_dim, a.hidden);
      t.linear(p + "self_attn.k_proj", a.kv_heads * a.head_dim, a.hidden);
      t.linear(p + "self_attn.v_proj", a.kv_heads * a.head_dim, a.hidden);
      t.linear(p + "self_attn.o_proj", a.hidden, a.heads * a.head_dim);
      if (a.qk_norm) {
        t.norm(p + "self_attn.q_norm.weight", a.head_dim);
        t.norm(p + "self_attn.k_norm.weight", a.head_dim);
      }
    }
    t.norm(p + "post_attention_layernorm.weight", a.hidden);
    const auto mlp = [&](const std::string& q, std::int64_t ffn) {
      t.linear(q + "gate_proj", ffn, a.hidden);
      t.linear(q + "up_proj", ffn, a.hidden);
      t.linear(q + "down_proj", a.hidden, ffn);
    };
    if (a.experts == 0 || i < a.dense_layers) {
      mlp(p + "mlp.", a.ffn);
      continue;
    }
    t.plain(p + "mlp.gate.weight", {a.experts, a.hidden});
    if (a.mla) t.plain(p + "mlp.gate.e_score_correction_bias", {a.experts});
    for (std::int64_t e = 0; e < a.experts; ++e)
      mlp(p + "mlp.experts." + std::to_string(e) + ".", a.expert_ffn);
    if (a.shared_experts > 0) mlp(p + "mlp.shared_experts.", a.shared_experts * a.expert_ffn);
  }
  t.norm("model.norm.weight", a.hidden);
  t.plain("lm_head.weight", {a.vocab, a.hidden});
  return t.take();
}

const std::pair<const char*, architecture> presets[] = {
    {"llama3-8b",
     {.vocab = 128256,
      .hidden = 4096,
      .layers = 32,
      .heads = 32,
      .kv_heads = 8,
      .head_dim = 128,
      .ffn = 14336}},
    {"qwen3-235b",
     {.vocab = 151936,
      .hidden = 4096,
      .layers = 94,
      .heads = 64,
      .kv_heads = 4,
      .head_dim = 128,
      .ffn = 12288,
      .experts = 128,
      .expert_ffn = 1536,
      .qk_norm = true}},
    {"deepseek-v3",
     {.vocab = 129280,
      .hidden = 7168,
      .layers = 61,
      .heads = 128,
      .kv_heads = 128,
      .head_dim = 128,
      .ffn = 18432,
      .dense_layers = 3,
      .experts = 256,
      .expert_ffn = 2048,
      .shared_experts = 1,
      .mla = true,
      .q_lora = 1536,
      .kv_lora = 512,
      .qk_nope = 128,
      .qk_rope = 64,
      .v_head = 128}},
    {"kimi-k2",
     {.vocab = 163840,
      .hidden = 7168,
      .layers = 61,
      .heads = 64,
      .kv_heads = 64,
      .head_dim = 128,
      .ffn = 18432,
      .dense_layers = 1,
      .experts = 384,
      .expert_ffn = 2048,
      .shared_experts = 1,
      .mla = true,
      .q_lora = 1536,
      .kv_lora = 512,
      .qk_nope = 128,
      .qk_rope = 64,
      .v_head = 128}},
};

}  // namespace

std::optional<std::vector<tensor_spec>> model_preset(const std::string& name, bool fp8) {
  for (const auto& [n, a] : presets)
    if (name == n) return build(a, fp8);
  return std::nullopt;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& [n, a] : presets) names.emplace_back(n);
  return names;
}

}  // namespace ferry
