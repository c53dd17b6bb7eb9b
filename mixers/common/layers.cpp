#include "mixers/common/layers.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>
#include <mutex>
#include <tuple>

#if defined(MIXBENCH_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include "mixers/common/rope_kernel.h"
#endif

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/fused_ops.h"
#include "harness/op_scope.h"

namespace mixbench::layers {

bool is_half(const at::Tensor& t) {
  return t.defined() && (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf);
}

at::Tensor f32(const at::Tensor& t) { return t.defined() ? t.to(at::kFloat) : t; }

at::Tensor rms_norm(const at::Tensor& x) {
  OpScope scope("mixbench::rms_norm");  // one launch on a GPU (at::rms_norm)
  // LibTorch's fused kernel on a GPU (one pass, fp32 statistics for half inputs, its own backward)
  if (x.is_cuda()) return at::rms_norm(x, {x.size(-1)}, std::nullopt, 1.1920928955078125e-07);
  if (is_half(x)) return rms_norm(f32(x)).to(x.scalar_type());  // statistics in fp32, as under autocast
  return x * at::rsqrt(x.pow(2).mean(-1, true) + 1.1920928955078125e-07);
}

#if defined(MIXBENCH_WITH_CUDA)
namespace {
rope_cuda::Dtype rope_dtype(const at::Tensor& x) {
  switch (x.scalar_type()) {
    case at::kFloat: return rope_cuda::Dtype::F32;
    case at::kBFloat16: return rope_cuda::Dtype::BF16;
    case at::kHalf: return rope_cuda::Dtype::F16;
    default: throw InputError("rope on CUDA takes fp32, bf16 or fp16");
  }
}
at::Tensor rope_apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse) {
  at::Tensor xc = x.contiguous(), y = at::empty_like(xc);
  rope_cuda::apply(rope_dtype(xc), xc.data_ptr(), y.data_ptr(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                   xc.numel() / xc.size(3), int(xc.size(1)), int(xc.size(2)), int(xc.size(3) / 2), inverse,
                   c10::cuda::getCurrentCUDAStream(xc.device().index()).stream());
  return y;
}
// The rotation is orthogonal: its backward is the rotation by −θ.
struct RopeFn : public torch::autograd::Function<RopeFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return rope_apply(x, cos, sin, false);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list g) {
    auto s = ctx->get_saved_variables();
    return {rope_apply(g[0], s[0], s[1], true), at::Tensor(), at::Tensor()};
  }
};
}  // namespace
#endif

namespace {
// x [B,T,H,D] rotated at positions `pos` ([1,T] or [B,T], FP64 on x's device).
at::Tensor rotate(const at::Tensor& x, const at::Tensor& pos, double base) {
  const int64_t D = x.size(3), half = D / 2;
  auto opts = at::TensorOptions().dtype(at::kDouble).device(pos.device());
  at::Tensor inv = at::pow(base, -at::arange(0, half, opts) * (2.0 / double(D)));
  at::Tensor ang = pos.unsqueeze(-1) * inv;  // [·, T, half]
  at::Tensor cos = ang.cos().to(x.options()).view({pos.size(0), pos.size(1), 1, half});
  at::Tensor sin = ang.sin().to(x.options()).view({pos.size(0), pos.size(1), 1, half});
  at::Tensor x1 = x.slice(-1, 0, half), x2 = x.slice(-1, half);
  return at::cat({x1 * cos + x2 * sin, x2 * cos - x1 * sin}, -1);
}
}  // namespace

at::Tensor rope(const at::Tensor& x, double base, int64_t offset) {
#if defined(MIXBENCH_WITH_CUDA)
  // One fused pass on a GPU (fp32 math, one rounding): the same values as the path below.
  if (x.is_cuda() && x.dim() == 4 && x.size(3) % 2 == 0 && x.scalar_type() != at::kDouble) {
    const int64_t T = x.size(1), half = x.size(3) / 2;
    auto opts = at::TensorOptions().dtype(at::kDouble).device(x.device());
    at::Tensor ang = at::outer(at::arange(offset, offset + T, opts), at::pow(base, -at::arange(0, half, opts) * (2.0 / double(x.size(3)))));
    return RopeFn::apply(x, ang.cos().to(at::kFloat), ang.sin().to(at::kFloat));
  }
#endif
  if (is_half(x)) return rope(f32(x), base, offset).to(x.scalar_type());  // one rounding, not three
  const int64_t T = x.size(1);
  return rotate(x, at::arange(offset, offset + T, at::TensorOptions().dtype(at::kDouble)).view({1, T}), base);
}

at::Tensor rope_pos_dev(const at::Tensor& x, double base, const at::Tensor& pos_dev) {
  if (x.dim() != 4 || x.size(1) != 1 || pos_dev.numel() != 1)
    throw InputError("rope at a device position takes x [B,1,H,D] and the position as one int64");
  OpScope scope("mixbench::rope_pos_dev");
#if defined(MIXBENCH_WITH_CUDA)
  // rope's fused GPU pass with the angle pos·θ_j formed on the device (the same double products)
  if (x.is_cuda() && x.size(3) % 2 == 0 && x.scalar_type() != at::kDouble) {
    const int64_t D = x.size(3), half = D / 2;
    auto opts = at::TensorOptions().dtype(at::kDouble).device(x.device());
    const at::Tensor inv = device_constant(fmt::format("rope_inv_freq/{}/{}", base, D), opts,
                                           [&] { return at::pow(base, -at::arange(0, half, opts) * (2.0 / double(D))); });
    const at::Tensor xc = x.contiguous();
    at::Tensor y = at::empty_like(xc);
    rope_cuda::apply_at_pos(rope_dtype(xc), xc.data_ptr(), y.data_ptr(), inv.data_ptr<double>(), pos_dev.data_ptr<int64_t>(),
                            xc.numel() / xc.size(3), int(half), c10::cuda::getCurrentCUDAStream(xc.device().index()).stream());
    return y;
  }
#endif
  return rope_at(x, base, pos_dev.view({1, 1}));
}

at::Tensor rope_at(const at::Tensor& x, double base, const at::Tensor& positions) {
  if (is_half(x)) return rope_at(f32(x), base, positions).to(x.scalar_type());
  return rotate(x, positions.to(at::kDouble), base);
}

at::Tensor device_constant(const std::string& key, const at::TensorOptions& opts, const std::function<at::Tensor()>& make) {
  if (!opts.device().is_cuda()) return make().to(opts);
  static std::mutex mu;
  // never destroyed: its CUDA tensors would outlive the CUDA context at exit
  static auto* cache = new std::map<std::tuple<std::string, int, int>, at::Tensor>();
  const auto k = std::make_tuple(key, int(opts.device().index()), int(c10::typeMetaToScalarType(opts.dtype())));
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(k);
  if (it == cache->end()) it = cache->emplace(k, make().to(opts)).first;
  return it->second;
}

at::Tensor logit_scale(int64_t T, double a, int64_t offset) {
  auto opts = at::TensorOptions().dtype(at::kDouble);
  return at::log(at::arange(offset, offset + T, opts) + a) / std::log(a);
}

double mean_visible(int64_t T, int64_t w) {
  if (T <= 0) return 0;
  if (w <= 0 || w >= T) return double(T + 1) / 2.0;
  // t < w: t+1 keys; t >= w: w keys
  double ramp = double(w) * double(w + 1) / 2.0;
  double flat = double(T - w) * double(w);
  return (ramp + flat) / double(T);
}

int64_t ve_width(const LayerCtx& ctx, int64_t heads, int64_t head_v) {
  return layer_has_ve(ctx) ? heads * head_v : 0;
}

void add_ve_gate_param(std::vector<ParamDef>& p, const LayerCtx& ctx, int64_t heads) {
  if (layer_has_ve(ctx))
    p.push_back({"ve_gate", {heads, kVeGateChannels}, ParamGroup::TransformerMatrix, true, "uniform", 0.0, 0.02});
}

int64_t ve_gate_params(const LayerCtx& ctx, int64_t heads) { return layer_has_ve(ctx) ? kVeGateChannels * heads : 0; }

at::Tensor add_value_embed(const at::Tensor& v, const TensorMap& in) {
  if (!in.has("ve")) return v;
  const at::Tensor& x = in.at("x");
  // v + 3·sigmoid(z)·ve, one pass each way on a GPU (harness/fused_ops.h)
  return gated_add(v, at::linear(x.slice(-1, 0, kVeGateChannels), in.at("ve_gate")), 3.0, in.at("ve").view(v.sizes()));
}

TensorMap layer_inputs(const LayerCtx& ctx, int64_t B, int64_t T, int64_t d, int64_t heads, int64_t head_v,
                       at::Generator& gen) {
  auto o = at::TensorOptions().dtype(at::kDouble);
  TensorMap in{{"x", at::randn({B, T, d}, gen, o)}};
  if (layer_has_ve(ctx)) in.set("ve", at::randn({B, T, heads * head_v}, gen, o));
  return in;
}

void require_ve_gate_width(const Config& c) {
  if (model_dims(c).d_model < kVeGateChannels) throw InputError("d_model must be at least 12 (VE gate channels)");
}

}  // namespace mixbench::layers
