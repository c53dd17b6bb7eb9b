// C entry points of the chunk kernels (mixers/linear/chunk_kernels.h) for ci/kernels/chunk_check.py
// (ctypes), so the kernels can be checked and timed against float64 references and peers without
// building the harness.
#include <stdexcept>
#include <cstdio>

#include "mixers/linear/chunk_kernels.h"

using namespace mixbench::linear::tc;

namespace {
template <typename F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
Dtype dtype_of(int fp16) { return fp16 ? Dtype::FP16 : Dtype::BF16; }
}  // namespace

extern "C" {
int ck_layout_ok() { return layout_ok() ? 1 : 0; }
int ck_set_tuning(int walk_bv, int out_split) {
  return guarded([&] { set_tuning(Tuning{walk_bv, out_split}); });
}
int ck_cumsum(const float* g, float* b, int B, int T, int H, void* stream) {
  return guarded([&] { chunk_cumsum(g, b, B, T, H, stream); });
}
int ck_decay_grad(int fp16, const void* q, const float* dqf, const void* k, const float* dkf, const float* y,
                  const float* z, const float* x2, const float* xdot, float* dg, void* dq, void* dk, int B, int T,
                  int H, int K, void* stream) {
  return guarded([&] {
    decay_grad(dtype_of(fp16), q, dqf, k, dkf, y, z, x2, dg, dq, dk, Dims{B, T, H, K, K}, stream, xdot);
  });
}
int ck_walk_fwd(int fp16, const void* k, const void* v, const void* w, const float* b, const float* h0, void* hs,
                void* vnew, float* ht, int B, int T, int H, int K, int V, void* stream) {
  return guarded([&] { walk_fwd(dtype_of(fp16), k, v, w, b, h0, hs, vnew, ht, Dims{B, T, H, K, V}, stream); });
}
int ck_fused(int fp16, const void* q, const void* k, const void* v, const void* w, const float* b, const float* h0,
             void* o, float* ht, float scale, int B, int T, int H, int K, int V, void* stream) {
  return guarded([&] { fused_fwd(dtype_of(fp16), q, k, v, w, b, h0, o, ht, scale, Dims{B, T, H, K, V}, stream); });
}
int ck_walk_bwd(int fp16, const void* q, const void* d_o, const float* b, const float* dht, void* dhs, float* dh0,
                float scale, int B, int T, int H, int K, int V, void* stream) {
  return guarded([&] { walk_bwd(dtype_of(fp16), q, d_o, b, dht, dhs, dh0, scale, Dims{B, T, H, K, V}, stream); });
}
int ck_walk_bwd_delta(int fp16, const void* q, const void* d_o, const void* k, const void* w, const void* dvl,
                      const float* b, const float* dht, void* dhs, void* du, float* dh0, float scale, int B, int T,
                      int H, int K, int V, void* stream) {
  return guarded([&] {
    walk_bwd_delta(dtype_of(fp16), q, d_o, k, w, dvl, b, dht, dhs, du, dh0, scale, Dims{B, T, H, K, V}, stream);
  });
}
int ck_dv_local(int fp16, const void* q, const void* k, const void* d_o, const float* b, void* dvl, float scale, int B,
                int T, int H, int K, int V, void* stream) {
  return guarded([&] { delta_dv_local(dtype_of(fp16), q, k, d_o, b, dvl, scale, Dims{B, T, H, K, V}, stream); });
}
int ck_wy_bwd(int fp16, const void* k, const void* v, const void* du, const void* hs, const float* x,
              const float* beta, const float* b, const float* dk_in, void* dk, void* dv, float* dbeta, float* x2,
              int B, int T, int H, int K, int V, void* stream) {
  return guarded([&] {
    delta_wy_bwd(dtype_of(fp16), k, v, du, hs, x, beta, b, dk_in, dk, dv, dbeta, x2, Dims{B, T, H, K, V}, stream);
  });
}
int ck_output(int fp16, const void* q, const void* k, const void* v, const float* b, const void* hs, void* o,
              float scale, int B, int T, int H, int K, int V, void* stream) {
  return guarded([&] { chunk_output(dtype_of(fp16), q, k, v, b, hs, o, scale, Dims{B, T, H, K, V}, stream); });
}
int ck_dqkv(int fp16, const void* q, const void* k, const void* v, const void* d_o, const float* b, const void* hs,
            const void* dhs, float* dqf, float* dkf, void* dv, float* y, float* z, float scale, int B, int T, int H,
            int K, int V, void* stream) {
  return guarded([&] {
    chunk_dqkv(dtype_of(fp16), q, k, v, d_o, b, hs, dhs, dqf, dkf, dv, y, z, scale, Dims{B, T, H, K, V}, stream);
  });
}
// chunk_dqkv forming the row dots: dq (and dk where not null, dkf otherwise) in the input dtype, xdot
int ck_dqkv_dots(int fp16, const void* q, const void* k, const void* v, const void* d_o, const float* b,
                 const void* hs, const void* dhs, float* dkf, void* dq, void* dk, void* dv, float* y, float* z,
                 float* xdot, float scale, int B, int T, int H, int K, int V, void* stream) {
  return guarded([&] {
    chunk_dqkv(dtype_of(fp16), q, k, v, d_o, b, hs, dhs, nullptr, dkf, dv, y, z, scale, Dims{B, T, H, K, V}, stream,
               dq, dk, xdot);
  });
}
int ck_prep(int fp16, const void* k, const void* v, const float* beta, const float* b, void* w, void* u, float* x,
            int B, int T, int H, int K, int V, void* stream) {
  return guarded([&] { delta_prep(dtype_of(fp16), k, v, beta, b, w, u, x, Dims{B, T, H, K, V}, stream); });
}
}
