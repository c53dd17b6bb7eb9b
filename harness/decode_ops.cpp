#include "harness/decode_ops.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <optional>
#include <stdexcept>
#include <vector>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/fused_ops.h"
#include "harness/op_scope.h"

#if defined(MIXBENCH_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>

#include "harness/decode_ops_kernel.h"
#endif

namespace mixbench {

#if defined(MIXBENCH_WITH_CUDA)
namespace {
bool kernel_dtype_ok(const at::Tensor& t) {
  const auto st = t.scalar_type();
  return t.is_cuda() && (st == at::kFloat || st == at::kBFloat16 || st == at::kHalf);
}
fused_cuda::Dtype kernel_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat      ? fused_cuda::Dtype::F32
         : t.scalar_type() == at::kBFloat16 ? fused_cuda::Dtype::BF16
                                            : fused_cuda::Dtype::F16;
}
cudaStream_t stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }
// t on x's device in x's dtype with x's shape (a tensor the row kernels read beside x)
bool beside(const at::Tensor& t, const at::Tensor& x) {
  return t.is_cuda() && t.device() == x.device() && t.scalar_type() == x.scalar_type() && t.sizes() == x.sizes();
}
bool scalar_beside(const at::Tensor& t, const at::Tensor& x) {
  return t.is_cuda() && t.device() == x.device() && t.numel() == 1;
}
}  // namespace
#endif

#if defined(MIXBENCH_WITH_CUDA)
namespace {
// The row kernels' arguments for residual_norm's inputs, with the tensors they point into, or
// nothing when the kernels cannot take the inputs. `normed`: allocate and point to the normed rows.
struct RowArgs {
  decode_cuda_ops::ResidualNormArgs p;
  at::Tensor xc, yc, zc, ac, bc;  // kept alive for the launch
  ResidualNorm out;
};
std::optional<RowArgs> row_args(const at::Tensor& x, const at::Tensor& y, ResidualMix mix, const at::Tensor& a,
                                const at::Tensor& b, const at::Tensor& z, bool keep_sum, bool normed) {
  if (!(kernel_dtype_ok(x) && x.dim() >= 1 && x.numel() > 0 && x.size(-1) <= decode_cuda_ops::kMaxRow &&
        (!y.defined() || beside(y, x)) &&
        (mix == ResidualMix::None || (beside(z, x) && scalar_beside(b, x) && (mix != ResidualMix::Scaled || scalar_beside(a, x))))))
    return std::nullopt;
  const at::ScalarType st = x.scalar_type();
  RowArgs r;
  r.xc = x.contiguous();
  r.yc = y.defined() ? y.contiguous() : at::Tensor();
  r.zc = mix != ResidualMix::None ? z.contiguous() : at::Tensor();
  r.ac = mix == ResidualMix::Scaled ? a.to(st) : at::Tensor();
  r.bc = mix != ResidualMix::None ? b.to(st) : at::Tensor();
  r.out.residual = at::empty_like(r.xc);
  if (normed) r.out.normed = at::empty_like(r.xc);
  if (keep_sum) r.out.sum = mix == ResidualMix::None ? r.out.residual : at::empty_like(r.xc);
  decode_cuda_ops::ResidualNormArgs& p = r.p;
  p.D = int(r.xc.size(-1));
  p.rows = r.xc.numel() / p.D;
  p.mix = mix == ResidualMix::None     ? decode_cuda_ops::Mix::None
          : mix == ResidualMix::Scaled ? decode_cuda_ops::Mix::Scaled
                                       : decode_cuda_ops::Mix::Backout;
  p.eps = float(kRmsEps);
  p.x = r.xc.data_ptr();
  p.y = r.yc.defined() ? r.yc.data_ptr() : nullptr;
  p.a = r.ac.defined() ? r.ac.data_ptr() : nullptr;
  p.b = r.bc.defined() ? r.bc.data_ptr() : nullptr;
  p.z = r.zc.defined() ? r.zc.data_ptr() : nullptr;
  p.residual = r.out.residual.data_ptr();
  p.sum = keep_sum && mix != ResidualMix::None ? r.out.sum.data_ptr() : nullptr;
  p.normed = normed ? r.out.normed.data_ptr() : nullptr;
  return r;
}
}  // namespace
#endif

static void check_mix(ResidualMix mix, const at::Tensor& a, const at::Tensor& b, const at::Tensor& z) {
  if (mix != ResidualMix::None && (!b.defined() || !z.defined() || (mix == ResidualMix::Scaled && !a.defined())))
    throw std::invalid_argument("residual_norm: the mix needs its scale(s) and z");
}

ResidualNorm residual_norm(const at::Tensor& x, const at::Tensor& y, ResidualMix mix, const at::Tensor& a,
                           const at::Tensor& b, const at::Tensor& z, bool keep_sum) {
  OpScope scope("mixbench::residual_norm");
  check_mix(mix, a, b, z);
#if defined(MIXBENCH_WITH_CUDA)
  if (std::optional<RowArgs> r = row_args(x, y, mix, a, b, z, keep_sum, true)) {
    decode_cuda_ops::residual_norm(kernel_dtype(r->xc), r->p, stream_of(r->xc));
    return r->out;
  }
#endif
  // the backbone's unfused ops, in its order
  const at::Tensor s = y.defined() ? x + y : x;
  ResidualNorm out;
  out.residual = mix == ResidualMix::Scaled ? scaled_sum(a, s, b, z) : mix == ResidualMix::Backout ? s - b * z : s;
  out.normed = backbone_rms_norm(out.residual);
  if (keep_sum) out.sum = s;
  return out;
}

EmbedStep embed_smear_step(const at::Tensor& wte, const at::Tensor& idx, const at::Tensor& w, const at::Tensor& lambda,
                           const at::Tensor& prev, const std::vector<at::Tensor>& tables) {
  OpScope scope("mixbench::embed_smear_step");
  if (idx.dim() != 2 || idx.size(1) != 1 || idx.scalar_type() != at::kLong || wte.dim() != 2 || w.dim() != 2 ||
      w.size(0) != 1 || w.size(1) > wte.size(1) || lambda.numel() != 1 ||
      prev.sizes() != at::IntArrayRef({idx.size(0), 1, wte.size(1)}))
    throw InputError(fmt::format("embed_smear_step takes idx [B,1] int64, wte [V,d], w [1,G≤d], λ [1] and prev [B,1,d] "
                                 "(got idx {}, wte {}, w {}, λ {}, prev {})",
                                 c10::str(idx.sizes()), c10::str(wte.sizes()), c10::str(w.sizes()),
                                 c10::str(lambda.sizes()), c10::str(prev.sizes())));
  for (const at::Tensor& t : tables)
    if (t.dim() != 2) throw InputError(fmt::format("embed_smear_step: a gathered table must be [vocab, w] (got {})", c10::str(t.sizes())));
  EmbedStep out;
#if defined(MIXBENCH_WITH_CUDA)
  const int64_t D = wte.size(1);
  bool tables_fit = tables.size() <= size_t(decode_cuda_ops::kMaxGather);
  for (const at::Tensor& t : tables)
    tables_fit = tables_fit && t.device() == wte.device() && t.scalar_type() == wte.scalar_type() && t.is_contiguous() &&
                 t.numel() > 0;
  if (kernel_dtype_ok(wte) && wte.is_contiguous() && D <= decode_cuda_ops::kMaxRow && w.size(1) <= 32 && tables_fit &&
      idx.device() == wte.device() && w.device() == wte.device() && lambda.device() == wte.device() &&
      prev.device() == wte.device() && prev.scalar_type() == wte.scalar_type() && prev.is_contiguous() &&
      w.scalar_type() == wte.scalar_type()) {
    const at::Tensor ic = idx.contiguous(), wc = w.contiguous(), lc = lambda.to(wte.scalar_type());
    at::Tensor x = at::empty_like(prev);
    decode_cuda_ops::EmbedSmearArgs p;
    p.rows = idx.size(0);
    p.vocab = wte.size(0);
    p.D = int(D);
    p.G = int(w.size(1));
    p.eps = float(kRmsEps);
    p.idx = ic.data_ptr<int64_t>();
    p.wte = wte.data_ptr();
    p.w = wc.data_ptr();
    p.lambda = lc.data_ptr();
    p.prev = prev.data_ptr();
    p.x = x.data_ptr();
    p.n_gather = int(tables.size());
    for (size_t t = 0; t < tables.size(); ++t) {
      out.gathered.push_back(at::empty({idx.size(0), 1, tables[t].size(1)}, tables[t].options()));
      p.gather_table[t] = tables[t].data_ptr();
      p.gather_vocab[t] = tables[t].size(0);
      p.gather_width[t] = tables[t].size(1);
      p.gather_out[t] = out.gathered.back().data_ptr();
    }
    decode_cuda_ops::embed_smear(kernel_dtype(wte), p, stream_of(wte));
    out.x = x;
    return out;
  }
#endif
  // the backbone's unfused ops
  const at::Tensor e = backbone_rms_norm(at::embedding(wte, idx));
  const at::Tensor gate = lambda * at::sigmoid(at::linear(e.slice(2, 0, w.size(1)), w));
  out.x = e + gate * prev;
  prev.copy_(e);
  for (const at::Tensor& t : tables) out.gathered.push_back(at::embedding(t, idx));
  return out;
}

int64_t decode_gemv_max_rows() {
  constexpr int64_t kMost = 8;  // decode_cuda_ops::kGemvRows
  const char* env = std::getenv("MIXBENCH_DECODE_GEMV_ROWS");
  if (!env) return 0;  // cuBLAS: faster than the GEMV kernels on an H200 at batch 1 and 8 (d12, bf16)
  const std::string v(env);
  if (v.empty() || v.size() > 1 || v[0] < '0' || v[0] > '0' + kMost)
    throw InputError(fmt::format("MIXBENCH_DECODE_GEMV_ROWS must be a whole number of rows in 0..{}, not '{}'", kMost, v));
  return v[0] - '0';
}

// An environment switch spelt `off` or `on` (unset: dflt); anything else is an InputError naming it.
static bool env_switch(const char* name, const char* off, const char* on, bool dflt) {
  const char* env = std::getenv(name);
  if (!env) return dflt;
  if (std::string(env) == on) return true;
  if (std::string(env) == off) return false;
  throw InputError(fmt::format("{} must be {} or {}, not '{}'", name, off, on, env));
}

bool decode_pdl_enabled() { return env_switch("MIXBENCH_DECODE_PDL", "0", "1", true); }

int64_t decode_split_min_slots() {
  const char* env = std::getenv("MIXBENCH_DECODE_SPLIT_MIN");
  if (!env) return 16;  // on an H200: d12 at batch 1 and 1K context 9 % faster than 64, the same at 32K and at batch 8
  for (int64_t v : {16, 32, 64, 128, 256})
    if (std::string(env) == std::to_string(v)) return v;
  throw InputError(fmt::format("MIXBENCH_DECODE_SPLIT_MIN must be 16, 32, 64, 128 or 256 cache slots, not '{}'", env));
}

std::string decode_split_by() {
  const char* env = std::getenv("MIXBENCH_DECODE_SPLIT_BY");
  if (!env) return "auto";
  for (const char* v : {"auto", "kv", "query"})
    if (std::string(env) == v) return v;
  throw InputError(fmt::format("MIXBENCH_DECODE_SPLIT_BY must be auto, kv or query, not '{}'", env));
}

int64_t decode_split_rows(int64_t B, int64_t H, int64_t Hkv) {
  const std::string by = decode_split_by();
  if (by == "kv") return B * Hkv;
  if (by == "query") return B * H;
  return std::max(B * Hkv, H);
}

bool decode_argmax_kernel_enabled() { return env_switch("MIXBENCH_DECODE_ARGMAX_KERNEL", "0", "1", true); }

nlohmann::json decode_knobs_json() {
  return {{"gemv_max_rows", decode_gemv_max_rows()},
          {"programmatic_launches", decode_pdl_enabled()},
          {"split_min_slots", decode_split_min_slots()},
          {"split_by", decode_split_by()},
          {"argmax_kernel", decode_argmax_kernel_enabled()}};
}

static void check_linear_inputs(const char* op, const at::Tensor& x, const at::Tensor& W) {
  if (W.dim() != 2 || x.dim() < 1 || x.size(-1) != W.size(1))
    throw InputError(fmt::format("{} takes x [..., K] and W [N, K] (got x {}, W {})", op, c10::str(x.sizes()),
                                 c10::str(W.sizes())));
}

#if defined(MIXBENCH_WITH_CUDA)
// x [..., K] · W [N, K]ᵀ through `kernel` for a few rows on the GPU, or undefined when the inputs do not fit it
using GemvKernel = void (*)(decode_cuda_ops::Dtype, const void*, const void*, void*, int, int64_t, int64_t, cudaStream_t);
static at::Tensor gemv_rows(const at::Tensor& x, const at::Tensor& W, GemvKernel kernel) {
  const int64_t rows = x.numel() / std::max<int64_t>(x.size(-1), 1);
  if (!(kernel_dtype_ok(x) && W.device() == x.device() && W.scalar_type() == x.scalar_type() && W.is_contiguous() &&
        rows >= 1 && rows <= std::min<int64_t>(decode_cuda_ops::kGemvRows, decode_gemv_max_rows()) && x.size(-1) > 0 && W.size(0) > 0))
    return at::Tensor();
  const at::Tensor xc = x.contiguous();
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = W.size(0);
  at::Tensor y = at::empty(shape, x.options());
  kernel(kernel_dtype(xc), xc.data_ptr(), W.data_ptr(), y.data_ptr(), int(rows), W.size(0), W.size(1), stream_of(xc));
  return y;
}
#endif

at::Tensor linear_relu_square(const at::Tensor& x, const at::Tensor& W) {
  OpScope scope("mixbench::linear_relu_square");
  check_linear_inputs("linear_relu_square", x, W);
#if defined(MIXBENCH_WITH_CUDA)
  if (at::Tensor y = gemv_rows(x, W, &decode_cuda_ops::linear_relu_square); y.defined()) return y;
#endif
  return relu_square(at::linear(x, W));
}

at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& W) {
  OpScope scope("mixbench::linear_rows");
  check_linear_inputs("linear_rows", x, W);
#if defined(MIXBENCH_WITH_CUDA)
  if (at::Tensor y = gemv_rows(x, W, &decode_cuda_ops::linear_rows); y.defined()) return y;
#endif
  return at::linear(x, W);
}

ResidualNorm residual_norm_linear(const at::Tensor& x, const at::Tensor& y, ResidualMix mix, const at::Tensor& a,
                                  const at::Tensor& b, const at::Tensor& z, bool keep_sum, const at::Tensor& W,
                                  bool relu_square, bool with_normed) {
  OpScope scope("mixbench::residual_norm_linear");
  check_mix(mix, a, b, z);
  check_linear_inputs("residual_norm_linear", x, W);
#if defined(MIXBENCH_WITH_CUDA)
  const int64_t D = x.size(-1), rows = x.numel() / std::max<int64_t>(D, 1);
  if (W.device() == x.device() && W.scalar_type() == x.scalar_type() && W.is_contiguous() && W.size(0) > 0 && rows >= 1 &&
      rows <= std::min<int64_t>(decode_cuda_ops::kGemvRows, decode_gemv_max_rows()) && rows * D <= decode_cuda_ops::kFusedRowElems) {
    if (std::optional<RowArgs> r = row_args(x, y, mix, a, b, z, keep_sum, with_normed)) {
      std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
      shape.back() = W.size(0);
      r->out.out = at::empty(shape, x.options());
      decode_cuda_ops::residual_norm_linear(kernel_dtype(r->xc), r->p, W.data_ptr(), r->out.out.data_ptr(), W.size(0),
                                            relu_square, stream_of(r->xc));
      return r->out;
    }
  }
#endif
  ResidualNorm out = residual_norm(x, y, mix, a, b, z, keep_sum);
  out.out = relu_square ? linear_relu_square(out.normed, W) : linear_rows(out.normed, W);
  if (!with_normed) out.normed = at::Tensor();
  return out;
}

at::Tensor softcap_logits(const at::Tensor& logits, double cap, const at::Tensor& advance) {
  OpScope scope("mixbench::softcap_logits");
  if (advance.defined() && (advance.numel() != 1 || advance.scalar_type() != at::kLong))
    throw std::invalid_argument("softcap_logits: the position to advance must be one int64");
#if defined(MIXBENCH_WITH_CUDA)
  if (kernel_dtype_ok(logits) && (!advance.defined() || advance.device() == logits.device())) {
    const at::Tensor lc = logits.contiguous();
    at::Tensor out = at::empty(lc.sizes(), lc.options().dtype(at::kFloat));
    decode_cuda_ops::softcap(kernel_dtype(lc), lc.data_ptr(), out.data_ptr<float>(), lc.numel(), float(cap),
                             advance.defined() ? advance.data_ptr<int64_t>() : nullptr, stream_of(lc));
    return out;
  }
#endif
  const at::Tensor l = logits.to(at::promote_types(logits.scalar_type(), at::kFloat));
  at::Tensor out = cap * at::tanh(l / cap);
  if (advance.defined()) advance.add_(1);
  return out;
}

void greedy_tokens_into(const at::Tensor& logits, const at::Tensor& out, GreedyScratch& scratch) {
  OpScope scope("mixbench::greedy_tokens");
  if (logits.dim() < 1 || logits.size(-1) < 1)
    throw InputError(fmt::format("greedy tokens take logits [..., V] with V >= 1 (got {})", c10::str(logits.sizes())));
  const int64_t V = logits.size(-1), rows = logits.numel() / V;
  if (out.scalar_type() != at::kLong || out.numel() != rows || !out.is_contiguous() || out.device() != logits.device())
    throw InputError(fmt::format("greedy tokens go into a contiguous int64 tensor of {} elements on the logits' device "
                                 "(got {} {} on {})",
                                 rows, c10::toString(out.scalar_type()), c10::str(out.sizes()), out.device().str()));
#if defined(MIXBENCH_WITH_CUDA)
  if (kernel_dtype_ok(logits) && rows <= 65535 && decode_argmax_kernel_enabled()) {
    const at::Tensor lc = logits.contiguous();
    const int64_t parts = rows * decode_cuda_ops::greedy_blocks_per_row(V);
    if (!scratch.counters.defined() || scratch.counters.device() != lc.device() || scratch.counters.numel() < rows ||
        scratch.part_v.numel() < parts) {
      scratch.counters = at::zeros({rows}, lc.options().dtype(at::kInt));
      scratch.part_v = at::empty({parts}, lc.options().dtype(at::kFloat));
      scratch.part_i = at::empty({parts}, lc.options().dtype(at::kLong));
    }
    decode_cuda_ops::greedy_tokens(kernel_dtype(lc), lc.data_ptr(), rows, V, out.data_ptr<int64_t>(),
                                   scratch.part_v.data_ptr<float>(), scratch.part_i.data_ptr<int64_t>(),
                                   reinterpret_cast<unsigned*>(scratch.counters.data_ptr<int32_t>()), stream_of(lc));
    return;
  }
#else
  (void)scratch;
#endif
  out.copy_(logits.argmax(-1).reshape(out.sizes()));
}

}  // namespace mixbench
