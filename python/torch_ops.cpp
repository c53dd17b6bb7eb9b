// torch.ops.mixbench: the registry's ops as PyTorch operators (libmixbench_torch_ops.so, loaded with
// torch.ops.load_library or python/mixbench_ops). Every operator wraps the op's registered paths
// (OpSpec::cpu on CPU tensors, OpSpec::cuda on CUDA tensors, harness/registry.h); no math is
// repeated here. Arguments follow flash-linear-attention's fla.ops (chunk_simple_gla, chunk_gla,
// chunk_delta_rule, chunk_gated_delta_rule, chunk_kda; naive_dsa_indexer) and, for attention,
// flash-attn's (q, k, v, causal, window, scale) in the [B,T,H,D] layout; python/mixbench_ops/
// __init__.py lists every difference.
//
// Autograd. Every differentiable operator is registered as CompositeImplicitAutograd: the paths it
// wraps are already differentiable through LibTorch's autograd (plain LibTorch ops, and
// torch::autograd::Function wrappers around the fused kernels, e.g. simple_gla_tc's and
// gated_delta_rule_tc's explicit backwards, the CPU raw-buffer forwards' recompute backwards), so
// autograd records what the path runs and the backward is the path's own. A separate Autograd
// kernel with its own torch::autograd::Function would have to recompute the forward in its backward
// (the registry exposes no stand-alone backward for most ops), which costs a forward pass more.
// The device is chosen inside the kernel from the inputs' device (CPU → OpSpec::cpu, CUDA →
// OpSpec::cuda). dsa_indexer returns integer indices and has no gradient: it is registered for the
// CPU and CUDA dispatch keys, with an Autograd kernel that runs it below autograd.
//
// CUDA graphs: the CUDA paths wrapped here make no host synchronisation once warmed up (the first
// call may probe the device and cache constants). The sparse ops' value checks on their index
// tensors copy them to the host, so on CUDA tensors these operators check shapes only and call the
// ops' math directly (mixers/sparse/sparse.h); on CPU tensors the registered path checks values too.
// torch.compile cannot trace these operators (their kernels read raw buffers): call them outside a
// compiled region.
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <fmt/format.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

#include "harness/errors.h"
#include "harness/registry.h"
#include "mixers/sparse/sparse.h"

namespace mixbench {
namespace {

using OptTensor = std::optional<at::Tensor>;

// Errors of the harness (InputError, UsageError) become Python ValueErrors with the same message.
template <typename F>
auto translate_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const InputError& e) {
    TORCH_CHECK_VALUE(false, e.what());
    throw;
  } catch (const UsageError& e) {
    TORCH_CHECK_VALUE(false, e.what());
    throw;
  }
}

Backend backend_of(const at::Tensor& t, const std::string& op) {
  if (t.is_cpu()) return Backend::CPU;
  if (t.is_cuda()) {
#if defined(MIXBENCH_WITH_CUDA)
    return Backend::CUDA;
#else
    TORCH_CHECK_VALUE(false, "mixbench::", op, ": this library was built without CUDA");
#endif
  }
  TORCH_CHECK_VALUE(false, "mixbench::", op, ": tensors on ", t.device(), " are not supported (CPU or CUDA)");
  return Backend::CPU;
}

// The op's default params with the given overrides, validated by its ConfigSpec.
Config op_params(const std::string& op, const std::vector<std::pair<std::string, Value>>& overrides) {
  return translate_errors([&] {
    const OpSpec& spec = Registry::get().op(op);
    Config c = spec.params.defaults();
    for (const auto& [k, v] : overrides) c.set(k, v);
    spec.params.validate(c);
    return c;
  });
}

// FLA's scale=None is the op's default (scale 0 = K^-0.5 / D^-0.5); an explicit scale must be > 0.
double scale_param(const std::string& op, const std::optional<double>& scale) {
  if (!scale) return 0.0;
  TORCH_CHECK_VALUE(*scale > 0, "mixbench::", op, ": scale must be > 0 (or None for the default), got ", *scale);
  return *scale;
}

// FLA's use_qk_l2norm_in_kernel: x / sqrt(Σx² + 1e-6) along the head dim (fla.modules.l2norm's
// eps), computed in at least fp32 and returned in x's dtype.
at::Tensor l2norm(const at::Tensor& x) {
  const bool half = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  at::Tensor xf = half ? x.to(at::kFloat) : x;
  at::Tensor y = xf * at::rsqrt(xf.pow(2).sum(-1, /*keepdim=*/true) + 1e-6);
  return half ? y.to(x.scalar_type()) : y;
}

TensorMap run(const std::string& op, const TensorMap& in, const Config& p, const at::Tensor& like) {
  return translate_errors([&] { return call_op(op, backend_of(like, op), in, p); });
}

// The linear ops: outputs (o, final_state); final_state is None unless output_final_state.
std::tuple<at::Tensor, at::Tensor> linear_result(const TensorMap& out, bool output_final_state) {
  return {out.at("o"), output_final_state ? out.at("ht") : at::Tensor()};
}

TensorMap linear_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptTensor& g,
                        const OptTensor& beta, const OptTensor& initial_state, bool l2norm_qk) {
  TensorMap in{{"q", (l2norm_qk ? l2norm(q) : q).contiguous()},
               {"k", (l2norm_qk ? l2norm(k) : k).contiguous()},
               {"v", v.contiguous()}};
  if (g) in.set("g", g->contiguous());
  if (beta) in.set("beta", beta->contiguous());
  if (initial_state && initial_state->defined()) in.set("h0", initial_state->contiguous());
  return in;
}

// ------------------------------------------------------------------ linear attention
std::tuple<at::Tensor, at::Tensor> simple_gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const OptTensor& g, const OptTensor& g_gamma,
                                              std::optional<double> scale, const OptTensor& initial_state,
                                              bool output_final_state) {
  const bool has_g = g && g->defined(), has_gamma = g_gamma && g_gamma->defined();
  TORCH_CHECK_VALUE(!(has_g && has_gamma), "mixbench::simple_gla: give g or g_gamma, not both");
  TORCH_CHECK_VALUE(q.dim() == 4, "mixbench::simple_gla: q must be [B,T,H,K], got ", q.dim(), " dims");
  at::Tensor gate;
  if (has_g) {
    gate = *g;
  } else if (has_gamma) {
    // a data-independent log decay per head: g[b,t,h] = g_gamma[h]
    TORCH_CHECK_VALUE(g_gamma->dim() == 1 && g_gamma->size(0) == q.size(2), "mixbench::simple_gla: g_gamma must be [H] = [",
                      q.size(2), "], got ", g_gamma->sizes());
    gate = g_gamma->to(q.scalar_type()).view({1, 1, q.size(2)}).expand({q.size(0), q.size(1), q.size(2)});
  } else {
    gate = at::zeros({q.size(0), q.size(1), q.size(2)}, q.options());  // no decay
  }
  const Config p = op_params("simple_gla", {{"scale", scale_param("simple_gla", scale)}});
  return linear_result(run("simple_gla", linear_inputs(q, k, v, gate, std::nullopt, initial_state, false), p, q),
                       output_final_state);
}

std::tuple<at::Tensor, at::Tensor> gla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& g, std::optional<double> scale,
                                       const OptTensor& initial_state, bool output_final_state) {
  const Config p = op_params("gla", {{"scale", scale_param("gla", scale)}});
  return linear_result(run("gla", linear_inputs(q, k, v, g, std::nullopt, initial_state, false), p, q),
                       output_final_state);
}

std::tuple<at::Tensor, at::Tensor> delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const at::Tensor& beta, std::optional<double> scale,
                                              const OptTensor& initial_state, bool output_final_state,
                                              bool use_qk_l2norm_in_kernel) {
  const Config p = op_params("delta_rule", {{"scale", scale_param("delta_rule", scale)}});
  return linear_result(
      run("delta_rule", linear_inputs(q, k, v, std::nullopt, beta, initial_state, use_qk_l2norm_in_kernel), p, q),
      output_final_state);
}

std::tuple<at::Tensor, at::Tensor> gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                    const at::Tensor& g, const at::Tensor& beta,
                                                    std::optional<double> scale, const OptTensor& initial_state,
                                                    bool output_final_state, bool use_qk_l2norm_in_kernel) {
  const Config p = op_params("gated_delta_rule", {{"scale", scale_param("gated_delta_rule", scale)}});
  return linear_result(
      run("gated_delta_rule", linear_inputs(q, k, v, g, beta, initial_state, use_qk_l2norm_in_kernel), p, q),
      output_final_state);
}

std::tuple<at::Tensor, at::Tensor> kda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& g, const at::Tensor& beta, std::optional<double> scale,
                                       const OptTensor& initial_state, bool output_final_state,
                                       bool use_qk_l2norm_in_kernel) {
  const Config p = op_params("kda", {{"scale", scale_param("kda", scale)}});
  return linear_result(run("kda", linear_inputs(q, k, v, g, beta, initial_state, use_qk_l2norm_in_kernel), p, q),
                       output_final_state);
}

// ------------------------------------------------------------------ softmax attention
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, int64_t window,
                     std::optional<double> scale, double logit_scale_a) {
  TORCH_CHECK_VALUE(causal, "mixbench::attention: only causal attention is implemented (causal=True)");
  TORCH_CHECK_VALUE(window >= 0, "mixbench::attention: window must be >= 0 (visible keys including self; 0 = all), got ",
                    window);
  const Config p = op_params("attention", {{"scale", scale_param("attention", scale)}, {"window", window},
                                           {"logit_scale_a", logit_scale_a}});
  TensorMap in{{"q", q.contiguous()}, {"k", k.contiguous()}, {"v", v.contiguous()}};
  return run("attention", in, p, q).at("o");
}

// ------------------------------------------------------------------ sparse attention
// Shape checks only (no host copy of the indices): the registered checks, on a CUDA tensor, would
// synchronise with the device to read the index values.
void check_qkv(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK_VALUE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "mixbench::", op, ": q, k, v must be [B,T,H,D]");
  TORCH_CHECK_VALUE(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(1) == q.size(1) && v.size(1) == q.size(1),
                    "mixbench::", op, ": q, k, v must share batch and length");
  TORCH_CHECK_VALUE(k.size(2) == v.size(2) && k.size(2) > 0 && q.size(2) % k.size(2) == 0, "mixbench::", op,
                    ": k and v need the same number of heads, a divisor of q's");
  TORCH_CHECK_VALUE(k.size(3) == q.size(3), "mixbench::", op, ": q and k head dims differ");
}

at::Tensor sparse_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& indices,
                            std::optional<double> scale) {
  const char* op = "sparse_attention";
  check_qkv(op, q, k, v);
  TORCH_CHECK_VALUE(indices.scalar_type() == at::kLong && indices.dim() == 3 && indices.size(0) == q.size(0) &&
                        indices.size(1) == q.size(1),
                    "mixbench::sparse_attention: indices must be int64 [B,T,topk] with q's B and T, got ",
                    indices.scalar_type(), " ", indices.sizes());
  const Config p = op_params(op, {{"scale", scale_param(op, scale)}, {"topk", indices.size(2)}});
  TensorMap in{{"q", q.contiguous()}, {"k", k.contiguous()}, {"v", v.contiguous()}, {"indices", indices.contiguous()}};
  if (backend_of(q, op) == Backend::CPU) return run(op, in, p, q).at("o");
  // the token-sparse kernels where they apply (fp32 / bf16 / fp16, D = Dv ∈ {64, 128}), else fp32 LibTorch
  const double s = scale ? *scale : 1.0 / std::sqrt(double(q.size(3)));
  return sparse_attention_fast(in.at("q"), in.at("k"), in.at("v"), in.at("indices"), s);
}

at::Tensor block_sparse_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& block_indices, int64_t block_size, int64_t q_block,
                                  std::optional<double> scale) {
  const char* op = "block_sparse_attention";
  check_qkv(op, q, k, v);
  TORCH_CHECK_VALUE(block_size >= 1, "mixbench::block_sparse_attention: block_size must be >= 1, got ", block_size);
  TORCH_CHECK_VALUE(q_block >= 0, "mixbench::block_sparse_attention: q_block must be >= 0 (0 = block_size), got ", q_block);
  const int64_t qb = q_block > 0 ? q_block : block_size, NQ = (q.size(1) + qb - 1) / qb;
  TORCH_CHECK_VALUE(block_indices.scalar_type() == at::kLong && block_indices.dim() == 4 &&
                        block_indices.size(0) == q.size(0) && block_indices.size(1) == k.size(2) &&
                        block_indices.size(2) == NQ,
                    "mixbench::block_sparse_attention: block_indices must be int64 [B,Hkv,ceil(T/q_block),topk] = [",
                    q.size(0), ",", k.size(2), ",", NQ, ",topk], got ", block_indices.scalar_type(), " ",
                    block_indices.sizes());
  const Config p = op_params(op, {{"scale", scale_param(op, scale)},
                                 {"block_size", block_size},
                                 {"q_block", q_block},
                                 {"topk", block_indices.size(3)}});
  TensorMap in{{"q", q.contiguous()}, {"k", k.contiguous()}, {"v", v.contiguous()},
               {"block_indices", block_indices.contiguous()}};
  if (backend_of(q, op) == Backend::CPU) return run(op, in, p, q).at("o");
  // the layers' entry point: the CUDA kernels where they apply, else the LibTorch path in fp32
  const double s = scale ? *scale : 1.0 / std::sqrt(double(q.size(3)));
  return block_sparse_attention_fast(in.at("q"), in.at("k"), in.at("v"), in.at("block_indices"), block_size, qb, s);
}

// ------------------------------------------------------------------ DSA lightning indexer
at::Tensor dsa_indexer(const at::Tensor& q_idx, const at::Tensor& k_idx, const OptTensor& w_idx, int64_t topk,
                       std::optional<double> scale, std::optional<c10::string_view> activation) {
  const char* op = "dsa_indexer";
  const std::string act = activation ? std::string(*activation) : std::string("none");
  TORCH_CHECK_VALUE(act == "relu" || act == "none", "mixbench::dsa_indexer: activation must be None, 'none' or 'relu', got '",
                    act, "'");
  TORCH_CHECK_VALUE(topk >= 1, "mixbench::dsa_indexer: topk must be >= 1, got ", topk);
  const Config p = op_params(op, {{"scale", scale_param(op, scale)}, {"topk", topk}, {"activation", act}});
  TensorMap in{{"q_idx", q_idx.contiguous()}, {"k_idx", k_idx.contiguous()}};
  if (w_idx && w_idx->defined()) in.set("w_idx", w_idx->contiguous());
  return run(op, in, p, q_idx).at("indices");
}

// Below autograd: the indices carry no gradient (the inputs' requires_grad is ignored).
at::Tensor dsa_indexer_autograd(const at::Tensor& q_idx, const at::Tensor& k_idx, const OptTensor& w_idx, int64_t topk,
                                std::optional<double> scale, std::optional<c10::string_view> activation) {
  at::AutoDispatchBelowADInplaceOrView guard;
  static auto handle = c10::Dispatcher::singleton().findSchemaOrThrow("mixbench::dsa_indexer", "").typed<decltype(dsa_indexer)>();
  return handle.call(q_idx, k_idx, w_idx, topk, scale, activation);
}

// ------------------------------------------------------------------ the FP64 references
// _reference(op, names, inputs, params): the op's registered FP64 reference (OpSpec::reference) on
// the registry's own input names ("q", "h0", ...) and params ("k=v,..."); its outputs in
// OpSpec::outputs order. For tests that compare the operators above with the harness's references.
std::vector<at::Tensor> reference(c10::string_view op_name, std::vector<std::string> names,
                                  std::vector<at::Tensor> inputs, c10::string_view params) {
  return translate_errors([&] {
    const std::string op(op_name);
    const OpSpec& spec = Registry::get().op(op);
    if (names.size() != inputs.size())
      throw UsageError(fmt::format("_reference: {} names for {} inputs", names.size(), inputs.size()));
    TensorMap in;
    for (size_t i = 0; i < names.size(); ++i) in.set(names[i], inputs[i]);
    const TensorMap out = call_op(op, Backend::Reference, in, spec.params.parse(std::string(params)));
    std::vector<at::Tensor> result;
    for (const std::string& name : spec.outputs) result.push_back(out.at(name));
    return result;
  });
}

// _kernel_notes(): the kernels or library backends the calls on this thread ran since the last
// call (comma-joined, e.g. "gated_delta_rule_tc"; harness/registry.h note_kernel), then cleared.
std::string kernel_notes() { return take_kernel_notes(); }

}  // namespace
}  // namespace mixbench

TORCH_LIBRARY(mixbench, m) {
  m.def("attention(Tensor q, Tensor k, Tensor v, bool causal=True, int window=0, float? scale=None, "
        "float logit_scale_a=0.0) -> Tensor");
  m.def("simple_gla(Tensor q, Tensor k, Tensor v, Tensor? g=None, Tensor? g_gamma=None, float? scale=None, "
        "Tensor? initial_state=None, bool output_final_state=False) -> (Tensor, Tensor)");
  m.def("gla(Tensor q, Tensor k, Tensor v, Tensor g, float? scale=None, Tensor? initial_state=None, "
        "bool output_final_state=False) -> (Tensor, Tensor)");
  m.def("delta_rule(Tensor q, Tensor k, Tensor v, Tensor beta, float? scale=None, Tensor? initial_state=None, "
        "bool output_final_state=False, bool use_qk_l2norm_in_kernel=False) -> (Tensor, Tensor)");
  m.def("gated_delta_rule(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float? scale=None, "
        "Tensor? initial_state=None, bool output_final_state=False, bool use_qk_l2norm_in_kernel=False) "
        "-> (Tensor, Tensor)");
  m.def("kda(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float? scale=None, Tensor? initial_state=None, "
        "bool output_final_state=False, bool use_qk_l2norm_in_kernel=False) -> (Tensor, Tensor)");
  m.def("sparse_attention(Tensor q, Tensor k, Tensor v, Tensor indices, float? scale=None) -> Tensor");
  m.def("block_sparse_attention(Tensor q, Tensor k, Tensor v, Tensor block_indices, int block_size, int q_block=0, "
        "float? scale=None) -> Tensor");
  m.def("dsa_indexer(Tensor q_idx, Tensor k_idx, Tensor? w_idx=None, int topk=2048, float? scale=None, "
        "str? activation=None) -> Tensor");
  m.def("_reference(str op, str[] names, Tensor[] inputs, str params=\"\") -> Tensor[]");
  m.def("_kernel_notes() -> str");
}

TORCH_LIBRARY_IMPL(mixbench, CompositeImplicitAutograd, m) {
  m.impl("attention", &mixbench::attention);
  m.impl("simple_gla", &mixbench::simple_gla);
  m.impl("gla", &mixbench::gla);
  m.impl("delta_rule", &mixbench::delta_rule);
  m.impl("gated_delta_rule", &mixbench::gated_delta_rule);
  m.impl("kda", &mixbench::kda);
  m.impl("sparse_attention", &mixbench::sparse_attention);
  m.impl("block_sparse_attention", &mixbench::block_sparse_attention);
  m.impl("_reference", &mixbench::reference);
  m.impl("_kernel_notes", &mixbench::kernel_notes);
}

TORCH_LIBRARY_IMPL(mixbench, CPU, m) { m.impl("dsa_indexer", &mixbench::dsa_indexer); }
#if defined(MIXBENCH_WITH_CUDA)
TORCH_LIBRARY_IMPL(mixbench, CUDA, m) { m.impl("dsa_indexer", &mixbench::dsa_indexer); }
#endif
TORCH_LIBRARY_IMPL(mixbench, Autograd, m) { m.impl("dsa_indexer", &mixbench::dsa_indexer_autograd); }
