// Op `attention`: causal softmax attention with GQA, a sliding window (visible keys including
// self, 0 = unlimited), a softmax scale, and HypeNet's optional per-query logit scale
// s_t = log_a(t + a). Layout [B,T,H,D] like flash-linear-attention's naive_parallel_attn.
//
// CPU path: LibTorch SDPA (is_causal, enable_gqa) for full attention; for windows, query blocks of
// 64 against only the keys they can see, each one SDPA call with a boolean mask, so work follows
// the number of visible blocks. The logit scale multiplies q_t before the call.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "harness/errors.h"
#include "harness/registry.h"
#include "mixers/attention/attention.h"
#include "mixers/common/layers.h"
#include "mixers/common/qkv_op.h"
#include "reference/reference.h"

namespace mixbench {

namespace {

using qkv_op::resolve_scale;

void check_attention_inputs(const TensorMap& in, const Config&) { qkv_op::check_inputs("attention", in); }

TensorMap reference_fn(const TensorMap& in, const Config& p) {
  check_attention_inputs(in, p);
  const auto& q = in.at("q");
  return {{"o", reference::attention(q, in.at("k"), in.at("v"), resolve_scale(p, q.size(3)), p.i("window"),
                                     p.f("logit_scale_a"))}};
}

TensorMap cpu_fn(const TensorMap& in, const Config& p) {
  check_attention_inputs(in, p);
  const auto& q = in.at("q");
  return {{"o", attention_cpu(q, in.at("k"), in.at("v"), resolve_scale(p, q.size(3)), p.i("window"),
                              p.f("logit_scale_a"))}};
}

ConfigSpec params_spec() {
  return qkv_op::params("attention",
                        [](ConfigSpec& s) {
                          s.i("window", 0, "visible keys including self; 0 = unlimited", 0)
                              .f("logit_scale_a", 0.0, "HypeNet logit scale base a (s_t = log_a(t+a)); 0 = off", 0.0);
                        })
      .rule([](const Config& c) {
        double a = c.f("logit_scale_a");
        if (a > 0 && a <= 1) throw InputError("attention: logit_scale_a must be > 1 (or 0 = off)");
      });
}

std::vector<CaseDef> cases() {
  ConfigSpec s = params_spec();
  auto c = [&](const std::string& kv) { return s.parse(kv); };
  return {
      {"T1", c("H=2,Hkv=2,D=8"), 1, 1},
      {"odd_B2", c("H=4,Hkv=4,D=16"), 2, 37},
      {"gqa", c("H=4,Hkv=2,D=16"), 2, 45},
      {"mqa", c("H=4,Hkv=1,D=8"), 1, 33},
      {"window7_gqa", c("H=4,Hkv=2,D=16,window=7"), 2, 150},
      {"window1", c("H=2,Hkv=1,D=8,window=1"), 1, 9},
      {"window_ge_T", c("H=2,Hkv=2,D=8,window=25"), 1, 20},
      {"window64_T130", c("H=2,Hkv=2,D=8,window=64"), 1, 130},
      {"logit_scale_a4", c("H=2,Hkv=1,D=8,logit_scale_a=4"), 2, 40},
      {"logit_scale_window", c("H=2,Hkv=2,D=8,logit_scale_a=300,window=5"), 1, 77},
      {"scale_Dv", c("H=2,Hkv=2,D=8,Dv=12,scale=0.3"), 2, 19},
  };
}

OpSpec make_spec() {
  OpSpec s = qkv_op::spec("attention", "attention", "causal softmax attention: GQA, sliding window, optional HypeNet logit scale",
                           "Vaswani et al. 2017; GQA (Ainslie et al. 2023); HypeNet logit scale (seed 000)",
                           params_spec(), {}, check_attention_inputs);
  s.make_inputs = qkv_op::make_inputs;
  s.reference = reference_fn;
  s.cpu = cpu_fn;
#if defined(MIXBENCH_WITH_CUDA)
  s.cuda = [](const TensorMap& in, const Config& p) {
    check_attention_inputs(in, p);
    const auto& q = in.at("q");
    return TensorMap{{"o", attention_cuda(q, in.at("k"), in.at("v"), resolve_scale(p, q.size(3)), p.i("window"),
                                          p.f("logit_scale_a"))}};
  };
#endif
  s.cases = cases;
  return s;
}

}  // namespace

at::Tensor apply_logit_scale(const at::Tensor& q, double a) {
  if (a <= 0) return q;
  const int64_t T = q.size(1);
  return q * layers::device_constant(fmt::format("logit_scale:{}:{:.17g}", T, a), q.options(), [&] { return layers::logit_scale(T, a); })
                 .view({1, T, 1, 1});
}

at::Tensor attention_cpu(const at::Tensor& q_in, const at::Tensor& k, const at::Tensor& v, double scale,
                         int64_t window, double logit_scale_a) {
  const int64_t T = q_in.size(1), H = q_in.size(2), Hkv = k.size(2);
  at::Tensor q = apply_logit_scale(q_in, logit_scale_a).transpose(1, 2);  // [B,H,T,D]
  at::Tensor kt = k.transpose(1, 2), vt = v.transpose(1, 2);
  const bool gqa = H != Hkv;
  if (window <= 0 || window >= T) {
    note_kernel("sdpa");
    return at::scaled_dot_product_attention(q, kt, vt, {}, 0.0, /*is_causal=*/true, scale, gqa)
        .transpose(1, 2)
        .contiguous();
  }
  note_kernel("sdpa-blockwise-window");
  constexpr int64_t kBlock = 64;
  std::vector<at::Tensor> outs;
  for (int64_t q0 = 0; q0 < T; q0 += kBlock) {
    const int64_t q1 = std::min(T, q0 + kBlock);
    const int64_t lo = std::max<int64_t>(0, q0 - window + 1);
    auto idx = at::TensorOptions().dtype(at::kLong).device(q.device());
    at::Tensor qpos = at::arange(q0, q1, idx).view({-1, 1});
    at::Tensor kpos = at::arange(lo, q1, idx).view({1, -1});
    at::Tensor mask = (kpos <= qpos).logical_and(qpos - kpos < window);
    outs.push_back(at::scaled_dot_product_attention(q.slice(2, q0, q1), kt.slice(2, lo, q1), vt.slice(2, lo, q1),
                                                    mask, 0.0, false, scale, gqa));
  }
  return at::cat(outs, 2).transpose(1, 2).contiguous();
}

MIXBENCH_REGISTER(make_spec());

}  // namespace mixbench

#if defined(MIXBENCH_WITH_CUDA)
namespace mixbench {
// On the GPU: full causal attention through SDPA (LibTorch picks flash / cuDNN / efficient);
// sliding windows through LibTorch's bundled FlashAttention with window_size_left = window − 1,
// window_size_right = 0, which skips the invisible blocks. FlashAttention needs fp16/bf16, equal
// q/k/v head dims that are multiples of 8 and at most 256; anything else falls back to the
// blockwise SDPA path. The HypeNet logit scale is applied to q_t before the call.
at::Tensor attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                          int64_t window, double logit_scale_a) {
  const int64_t T = q.size(1), D = q.size(3);
  const bool half = q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf;
  if (window > 0 && window < T && half && v.size(3) == D && D % 8 == 0 && D <= 256) {
    note_kernel("flash-window");
    at::Tensor qs = apply_logit_scale(q, logit_scale_a).contiguous();
    auto out = at::_flash_attention_forward(qs, k.contiguous(), v.contiguous(), std::nullopt, std::nullopt, T, T, 0.0,
                                            /*is_causal=*/true, /*return_debug_mask=*/false, scale, window - 1,
                                            int64_t(0));
    return std::get<0>(out);
  }
  return attention_cpu(q, k, v, scale, window, logit_scale_a);
}
}  // namespace mixbench
#endif
