#include "harness/flop_counter.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <cstring>

namespace mixbench {

struct FlopCounter::State {
  double total = 0;
  std::map<std::string, double> by_op;
  int attention_depth = 0;
};

namespace {
thread_local FlopCounter::State* g_state = nullptr;

bool is_attention(const char* name) {
  return std::strstr(name, "scaled_dot_product") != nullptr || std::strstr(name, "flash_attention") != nullptr ||
         std::strstr(name, "efficient_attention") != nullptr || std::strstr(name, "cudnn_attention") != nullptr;
}

double sizes_prod(const at::Tensor& t, int64_t skip_last = 0) {
  double p = 1;
  for (int64_t i = 0; i < t.dim() - skip_last; ++i) p *= double(t.size(i));
  return p;
}

double attention_flops(const c10::ArrayRef<c10::IValue>& in) {
  // aten::scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
  if (in.size() < 3 || !in[0].isTensor() || !in[1].isTensor() || !in[2].isTensor()) return 0;
  const at::Tensor& q = in[0].toTensor();
  const at::Tensor& k = in[1].toTensor();
  const at::Tensor& v = in[2].toTensor();
  if (q.dim() < 2) return 0;
  const int64_t Tq = q.size(-2), Tk = k.size(-2), Dk = q.size(-1), Dv = v.size(-1);
  const double batch_heads = sizes_prod(q, 2);
  double pairs = double(Tq) * double(Tk);
  bool causal = in.size() > 5 && in[5].isBool() && in[5].toBool();
  if (in.size() > 3 && in[3].isTensor()) {
    at::Tensor m = in[3].toTensor();
    at::Tensor allowed = m.scalar_type() == at::kBool ? m : at::isfinite(m);
    // broadcast to [.., Tq, Tk] over batch and heads
    double total_allowed = allowed.sum().item<double>();
    double mask_bh = 1;
    for (int64_t i = 0; i < m.dim() - 2; ++i) mask_bh *= double(m.size(i));
    return 2.0 * double(Dk + Dv) * total_allowed * (batch_heads / mask_bh);
  }
  if (causal) {
    pairs = 0;
    for (int64_t i = 0; i < Tq; ++i) pairs += double(std::min<int64_t>(i + 1, Tk));
  }
  return 2.0 * double(Dk + Dv) * pairs * batch_heads;
}

double matmul_flops(const char* name, const c10::ArrayRef<c10::IValue>& in) {
  auto t = [&](size_t i) -> const at::Tensor* { return i < in.size() && in[i].isTensor() ? &in[i].toTensor() : nullptr; };
  if (!std::strcmp(name, "aten::mm")) {
    if (!t(0) || !t(1)) return 0;
    return 2.0 * t(0)->size(0) * t(0)->size(1) * t(1)->size(1);
  }
  if (!std::strcmp(name, "aten::addmm")) {
    if (!t(1) || !t(2)) return 0;
    return 2.0 * t(1)->size(0) * t(1)->size(1) * t(2)->size(1);
  }
  if (!std::strcmp(name, "aten::bmm")) {
    if (!t(0) || !t(1)) return 0;
    return 2.0 * t(0)->size(0) * t(0)->size(1) * t(0)->size(2) * t(1)->size(2);
  }
  if (!std::strcmp(name, "aten::baddbmm")) {
    if (!t(1) || !t(2)) return 0;
    return 2.0 * t(1)->size(0) * t(1)->size(1) * t(1)->size(2) * t(2)->size(2);
  }
  if (!std::strcmp(name, "aten::mv")) {
    if (!t(0)) return 0;
    return 2.0 * t(0)->size(0) * t(0)->size(1);
  }
  if (!std::strcmp(name, "aten::addmv")) {
    if (!t(1)) return 0;
    return 2.0 * t(1)->size(0) * t(1)->size(1);
  }
  if (!std::strcmp(name, "aten::linalg_solve_triangular")) {
    // A [.., n, n] \ B [.., n, m] by substitution: n(n−1)·m multiply-adds ·2/2 per column pair,
    // i.e. n(n−1)·m FLOPs with a unit diagonal, n²·m otherwise; batch dims from B.
    if (!t(0) || !t(1)) return 0;
    const at::Tensor& B = *t(1);
    const double n = double(B.size(-2)), m = double(B.size(-1));
    double batch = 1;
    for (int64_t i = 0; i < B.dim() - 2; ++i) batch *= double(B.size(i));
    const bool unit = in.size() > 4 && in[4].isBool() && in[4].toBool();
    return batch * (unit ? n * (n - 1) : n * n) * m;
  }
  if (!std::strcmp(name, "aten::dot")) {
    if (!t(0)) return 0;
    return 2.0 * t(0)->numel();
  }
  return 0;
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  FlopCounter::State* s = g_state;
  if (!s) return nullptr;
  const char* name = fn.name();
  if (is_attention(name)) {
    if (s->attention_depth++ == 0) {
      double f = attention_flops(fn.inputs());
      s->total += f;
      s->by_op["attention"] += f;
    }
    return nullptr;
  }
  if (s->attention_depth > 0) return nullptr;
  double f = matmul_flops(name, fn.inputs());
  if (f > 0) {
    s->total += f;
    s->by_op[name] += f;
  }
  return nullptr;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext*) {
  FlopCounter::State* s = g_state;
  if (s && is_attention(fn.name())) --s->attention_depth;
}
}  // namespace

FlopCounter::FlopCounter() : state_(std::make_shared<State>()) {
  g_state = state_.get();
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback(on_enter, on_exit).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
}

FlopCounter::~FlopCounter() {
  at::removeCallback(handle_);
  g_state = nullptr;
}

double FlopCounter::total() const { return state_->total; }
const std::map<std::string, double>& FlopCounter::by_op() const { return state_->by_op; }

}  // namespace mixbench
