#include "mixers/sparse/sparse_decode.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <limits>

#include "harness/errors.h"
#include "harness/op_scope.h"
#include "mixers/attention/attention.h"
#include "mixers/common/layers.h"

#if defined(MIXBENCH_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>

#include "mixers/sparse/decode_rows_kernel.h"
#endif

namespace mixbench::sparse_decode {

Step begin_step(const TensorMap& cache, const at::Tensor& x) {
  if (x.dim() != 3 || x.size(1) != 1) throw InputError("sparse attention decode takes x [B,1,d]");
  Step st;
  if (cache_is_static(cache)) {
    st.is_static = true;
    st.pos = cache_pos_dev(cache);
    st.rows = cache_capacity(cache);
    if (!cache.has("k")) throw InputError("sparse attention decode needs a cache filled by its prefill");
  } else {
    if (!cache.has("k")) throw InputError("sparse attention decode needs a cache filled by its prefill");
    const int64_t pos = cache_pos(cache);
    st.pos = at::full({1}, pos, x.options().dtype(at::kLong));
    st.rows = pos + 1;
  }
  return st;
}

void end_step(TensorMap& cache, const Step& st) {
  if (!st.is_static) set_cache_pos(cache, st.rows);
}

int64_t begin_prefill(TensorMap& cache, int64_t T) {
  reset_cache(cache);
  set_cache_pos(cache, T);
  if (!cache_is_static(cache)) return T;
  const int64_t cap = cache_capacity(cache);
  if (T >= cap)
    throw InputError(fmt::format("a static cache of {} tokens cannot take a prefill of {} plus a decoded token", cap, T));
  return cap;
}

PrefillKV prefill_kv(const TensorMap& in, TensorMap& cache, const Config& c) {
  const int64_t rows = begin_prefill(cache, in.at("x").size(1));
  sparse_layer::QKV a = sparse_layer::qkv(in, c);
  store(cache, "k", a.k, rows);
  store(cache, "v", a.v, rows);
  return {std::move(a), rows};
}

int64_t prefill_block_rows(const TensorMap& cache, int64_t T, int64_t block) {
  return cache_is_static(cache) ? (cache_capacity(cache) + block - 1) / block : T / block;
}

void store(TensorMap& cache, const std::string& name, const at::Tensor& t, int64_t rows) {
  if (!cache_is_static(cache)) {
    cache.set(name, t.contiguous());
    return;
  }
  std::vector<int64_t> shape = t.sizes().vec();
  shape[1] = rows;
  if (!cache.has(name) || cache.at(name).sizes() != at::IntArrayRef(shape) || cache.at(name).dtype() != t.dtype() ||
      cache.at(name).device() != t.device())
    cache.set(name, at::zeros(shape, t.options()));
  if (t.size(1) > 0) cache.at(name).narrow(1, 0, t.size(1)).copy_(t);
}

void store_ring(TensorMap& cache, const std::string& name, const at::Tensor& t, int64_t block) {
  std::vector<int64_t> shape = t.sizes().vec();
  shape[1] = block;
  if (!cache_is_static(cache) || !cache.has(name) || cache.at(name).sizes() != at::IntArrayRef(shape) ||
      cache.at(name).dtype() != t.dtype() || cache.at(name).device() != t.device())
    cache.set(name, at::zeros(shape, t.options()));
  if (t.size(1) > 0) cache.at(name).narrow(1, 0, t.size(1)).copy_(t);
}

void put(TensorMap& cache, const std::string& name, const at::Tensor& row, const at::Tensor& at, int64_t rows) {
  at::Tensor buf = cache.at(name);
  if (!cache_is_static(cache) && buf.size(1) < rows) {
    std::vector<int64_t> shape = buf.sizes().vec();
    shape[1] = rows - buf.size(1);
    buf = at::cat({buf, at::zeros(shape, buf.options())}, 1);
    cache.set(name, buf);
  }
  buf.index_copy_(1, at, row.to(buf.scalar_type()));
}

sparse_layer::QKV qkv_at(const TensorMap& in, const Config& c, const at::Tensor& pos) {
  const sparse_layer::Dims d = sparse_layer::dims(c);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0);
  const double base = c.f("rope_base");
  at::Tensor q = at::linear(x, in.at("c_q")).view({B, 1, d.H, d.dh});
  at::Tensor k_raw = at::linear(x, in.at("c_k")).view({B, 1, d.Hkv, d.dh});
  at::Tensor v = layers::add_value_embed(at::linear(x, in.at("c_v")).view({B, 1, d.Hkv, d.dh}), in);
  q = layers::rms_norm(layers::rope_pos_dev(q, base, pos)) * 1.2;
  at::Tensor k = layers::rms_norm(layers::rope_pos_dev(k_raw, base, pos)) * 1.2;
  return {q, k, v, k_raw};
}

at::Tensor block_rows_of(const at::Tensor& buf, const at::Tensor& blk, int64_t block) {
  const at::Tensor rows = (blk * block + at::arange(block, blk.options())).clamp_max(buf.size(1) - 1);
  return buf.index_select(1, rows);
}

Keys block_keys(const at::Tensor& sel, int64_t block, const at::Tensor& pos) {
  const int64_t B = sel.size(0), S = sel.size(1), n = sel.size(2);
  const at::Tensor keys = sel.unsqueeze(-1) * block + at::arange(block, sel.options()).view({1, 1, 1, block});
  const at::Tensor valid = (sel >= 0).unsqueeze(-1).logical_and(keys <= pos.view({1, 1, 1, 1}));
  return {keys.view({B, S, n * block}), valid.view({B, S, n * block})};
}

at::Tensor attend_keys(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& keys,
                       const at::Tensor& valid, double scale) {
  const int64_t B = q.size(0), H = q.size(1), dh = q.size(2), L = K.size(1), Hkv = K.size(2), G = H / Hkv;
  const int64_t S = keys.size(1), n = keys.size(2);
  if (S != 1 && S != Hkv && S != H)
    throw std::logic_error(fmt::format("attend_keys: {} selection rows for {} heads and {} KV heads", S, H, Hkv));
  // selection rows per KV head: 1 (shared by the group's query heads) or G (one per query head)
  const int64_t Gs = S == H ? G : 1;
  if (S != H || G == 1) {  // one list per row or per KV head: the split-KV kernel over the listed slots
    const at::Tensor o = attention_decode_listed(q, K, V, keys, valid, scale);
    if (o.defined()) return o;
  }
  const at::Tensor idx = keys.clamp(0, L - 1).expand({B, S == 1 ? Hkv : S, n}).reshape({B, Hkv, Gs * n});
  const at::Tensor ok = valid.expand({B, S == 1 ? Hkv : S, n}).reshape({B, Hkv, Gs, 1, n});
  const at::Tensor gi = idx.unsqueeze(-1).expand({B, Hkv, Gs * n, dh});
  const bool half = layers::is_half(q);
  auto up = [&](const at::Tensor& t) { return half ? layers::f32(t) : t; };
  // gathered keys and values [B,Hkv,Gs,n,dh]
  const at::Tensor Kg = up(at::gather(K.permute({0, 2, 1, 3}), 2, gi)).view({B, Hkv, Gs, n, dh});
  const at::Tensor Vg = up(at::gather(V.permute({0, 2, 1, 3}), 2, gi)).view({B, Hkv, Gs, n, dh});
  const at::Tensor qh = up(q).reshape({B, Hkv, Gs, G / Gs, dh});
  at::Tensor lg = at::matmul(qh, Kg.transpose(-1, -2)) * scale;  // [B,Hkv,Gs,G/Gs,n]
  lg = lg.masked_fill(ok.logical_not(), -std::numeric_limits<double>::infinity());
  const at::Tensor o = at::matmul(at::softmax(lg, -1), Vg);  // [B,Hkv,Gs,G/Gs,dh]
  return o.reshape({B, H, dh}).to(q.scalar_type());
}

namespace {

void check_rows(const at::Tensor& a, const at::Tensor& buf, const at::Tensor& pos, int64_t per, const char* what) {
  if (a.dim() != 4 || buf.dim() != 4 || a.size(0) != buf.size(0) || a.size(1) != buf.size(2) || per < 1 ||
      pos.numel() != 1 || pos.scalar_type() != at::kLong || pos.device() != a.device() || buf.device() != a.device())
    throw std::logic_error(fmt::format("sparse_decode::{}: takes [B,S,G,·] against a buffer [B,L,S,D] and an int64 [1] "
                                       "position on their device (got {}, {}, per {})",
                                       what, c10::str(a.sizes()), c10::str(buf.sizes()), per));
}

// Rows j of an L-row buffer reached from pos: j ≤ pos / per, as a [L] bool on pos's device.
at::Tensor reached(const at::Tensor& pos, int64_t per, int64_t L) {
  return at::arange(L, pos.options()).le(at::div(pos, per, "floor"));
}

// The reached rows' count read on the host: CPU tensors only (no synchronisation).
int64_t reach_host(const at::Tensor& pos, int64_t per, int64_t L) {
  return std::min(pos.item<int64_t>() / per + 1, L);
}

at::Tensor in_dtype(const at::Tensor& t, at::ScalarType st) { return t.scalar_type() == st ? t : t.to(st); }

// The products themselves (rows given: the CPU's reached rows or the whole buffer).
at::Tensor scores_of(const at::Tensor& q, const at::Tensor& K, const at::Tensor& w) {
  at::Tensor s = at::matmul(q, in_dtype(K, q.scalar_type()).permute({0, 2, 3, 1}));  // [B,S,G,n]
  if (!w.defined()) return s;
  return at::matmul(w.unsqueeze(-2), at::relu(s)).squeeze(-2);  // [B,S,n]
}
at::Tensor mix_of(const at::Tensor& p, const at::Tensor& V) {
  return at::matmul(in_dtype(p, V.scalar_type()), V.permute({0, 2, 1, 3}));  // [B,S,G,D]
}

#if defined(MIXBENCH_WITH_CUDA)
bool kernel_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}
decode_rows_cuda::Dtype dtype_of(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat      ? decode_rows_cuda::Dtype::F32
         : t.scalar_type() == at::kBFloat16 ? decode_rows_cuda::Dtype::BF16
                                            : decode_rows_cuda::Dtype::F16;
}
bool kernel_takes(const at::Tensor& a, const at::Tensor& buf) {
  return a.is_cuda() && kernel_dtype(a) && kernel_dtype(buf) && decode_rows_cuda::supported(dtype_of(a), dtype_of(buf));
}
#endif

}  // namespace

at::Tensor row_scores_masked(const at::Tensor& q, const at::Tensor& K, const at::Tensor& pos, int64_t per,
                             const at::Tensor& w) {
  check_rows(q, K, pos, per, "row_scores");
  // each row's result depends on that row alone: masking the result drops what the dead rows held
  return scores_of(q, K, w).masked_fill(reached(pos, per, K.size(1)).logical_not(), 0);
}

at::Tensor row_mix_masked(const at::Tensor& p, const at::Tensor& V, const at::Tensor& pos, int64_t per) {
  check_rows(p, V, pos, per, "row_mix");
  const int64_t L = V.size(1);
  const at::Tensor dead = reached(pos, per, L).logical_not();
  return mix_of(p.masked_fill(dead, 0), V.masked_fill(dead.view({1, L, 1, 1}), 0));
}

at::Tensor row_scores(const at::Tensor& q, const at::Tensor& K, const at::Tensor& pos, int64_t per, const at::Tensor& w) {
  OpScope scope("mixbench::decode_row_scores");  // one launch on a GPU
  check_rows(q, K, pos, per, "row_scores");
  const int64_t B = q.size(0), S = q.size(1), G = q.size(2), D = q.size(3), L = K.size(1);
  if (K.size(3) != D || (w.defined() && (w.sizes() != at::IntArrayRef({B, S, G}) || w.scalar_type() != q.scalar_type())))
    throw std::logic_error(fmt::format("sparse_decode::row_scores: q {}, K {}, w {}", c10::str(q.sizes()),
                                       c10::str(K.sizes()), w.defined() ? c10::str(w.sizes()) : "none"));
#if defined(MIXBENCH_WITH_CUDA)
  if (kernel_takes(q, K)) {
    const at::Tensor qc = q.contiguous(), Kc = K.contiguous(), wc = w.defined() ? w.contiguous() : at::Tensor();
    at::Tensor out = w.defined() ? at::empty({B, S, L}, q.options()) : at::empty({B, S, G, L}, q.options());
    decode_rows_cuda::row_scores(dtype_of(qc), dtype_of(Kc), qc.data_ptr(), Kc.data_ptr(),
                                 wc.defined() ? wc.data_ptr() : nullptr, out.data_ptr(), pos.data_ptr<int64_t>(), per,
                                 int(B), int(S), int(G), int(D), int(L),
                                 c10::cuda::getCurrentCUDAStream(q.device().index()).stream());
    return out;
  }
#endif
  if (!q.is_cpu()) return row_scores_masked(q, K, pos, per, w);
  const int64_t n = reach_host(pos, per, L);
  return at::constant_pad_nd(scores_of(q, K.narrow(1, 0, n), w), {0, L - n});
}

at::Tensor row_mix(const at::Tensor& p, const at::Tensor& V, const at::Tensor& pos, int64_t per) {
  OpScope scope("mixbench::decode_row_mix");  // one launch on a GPU
  check_rows(p, V, pos, per, "row_mix");
  const int64_t B = p.size(0), S = p.size(1), G = p.size(2), L = V.size(1), D = V.size(3);
  if (p.size(3) != L) throw std::logic_error(fmt::format("sparse_decode::row_mix: p {}, V {}", c10::str(p.sizes()), c10::str(V.sizes())));
#if defined(MIXBENCH_WITH_CUDA)
  if (kernel_takes(p, V)) {
    const at::Tensor pc = p.contiguous(), Vc = V.contiguous();
    at::Tensor out = at::empty({B, S, G, D}, V.options());
    decode_rows_cuda::row_mix(dtype_of(pc), dtype_of(Vc), pc.data_ptr(), Vc.data_ptr(), out.data_ptr(),
                              pos.data_ptr<int64_t>(), per, int(B), int(S), int(G), int(D), int(L),
                              c10::cuda::getCurrentCUDAStream(p.device().index()).stream());
    return out;
  }
#endif
  if (!p.is_cpu()) return row_mix_masked(p, V, pos, per);
  const int64_t n = reach_host(pos, per, L);
  return mix_of(p.narrow(3, 0, n), V.narrow(1, 0, n));
}

}  // namespace mixbench::sparse_decode
