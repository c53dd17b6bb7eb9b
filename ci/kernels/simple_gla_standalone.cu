// Standalone check of the simple_gla CUDA kernel without LibTorch: ci/kernels/simple_gla_check.sh
// extracts the kernel from mixers/linear/simple_gla_cuda.cu into kernel_body.inc, this program runs
// it on random inputs (outputs NaN-poisoned) against a float64 token-by-token recurrence on the
// host, then times one bf16 shape (B·T = 64K, H = 16, K = V = 128) with CUDA events.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace sg {
constexpr int64_t kGlaChunk = 64;
#include "kernel_body.inc"
}  // namespace sg

#define CK(x)                                                                             \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

template <typename S> S h_from(float x);
template <> float h_from<float>(float x) { return x; }
template <> __nv_bfloat16 h_from<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __half h_from<__half>(float x) { return __float2half(x); }
float h_to(float x) { return x; }
float h_to(__nv_bfloat16 x) { return __bfloat162float(x); }
float h_to(__half x) { return __half2float(x); }

int g_bv = 64;
template <typename S, int K>
void run_kernel(const S* q, const S* k, const S* v, const float* g, const float* h0, S* o, float* ht, int B, int T,
                int H, int V, float scale, cudaStream_t st = 0) {
  if (g_bv == 32) {
    const size_t smem = sg::smem_floats<K, 32>() * sizeof(float);
    auto kern = sg::simple_gla_fwd_kernel<S, K, 32>;
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    kern<<<B * H * (V / 32), 256, smem, st>>>(q, k, v, g, h0, o, ht, T, H, V, scale);
  } else {
    const size_t smem = sg::smem_floats<K, 64>() * sizeof(float);
    auto kern = sg::simple_gla_fwd_kernel<S, K, 64>;
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    kern<<<B * H * (V / 64), 256, smem, st>>>(q, k, v, g, h0, o, ht, T, H, V, scale);
  }
  CK(cudaGetLastError());
}

template <typename S, int K>
double check(int B, int T, int H, int V, bool use_h0, std::mt19937& rng, double* err_ht) {
  std::normal_distribution<float> nd;
  const size_t nq = size_t(B) * T * H * K, nv = size_t(B) * T * H * V, ng = size_t(B) * T * H, ns = size_t(B) * H * K * V;
  std::vector<S> q(nq), k(nq), v(nv);
  std::vector<float> g(ng), h0(ns);
  for (auto& x : q) x = h_from<S>(nd(rng));
  for (auto& x : k) x = h_from<S>(nd(rng));
  for (auto& x : v) x = h_from<S>(nd(rng));
  for (auto& x : g) { float z = nd(rng); x = -std::log1p(std::exp(-z)) / 4.f; }
  for (auto& x : h0) x = nd(rng);
  const float scale = 0.3f;
  S *dq, *dk, *dv, *dout;
  float *dg, *dh0, *dht;
  CK(cudaMalloc(&dq, nq * sizeof(S))); CK(cudaMalloc(&dk, nq * sizeof(S))); CK(cudaMalloc(&dv, nv * sizeof(S)));
  CK(cudaMalloc(&dout, nv * sizeof(S))); CK(cudaMalloc(&dg, ng * 4)); CK(cudaMalloc(&dh0, ns * 4)); CK(cudaMalloc(&dht, ns * 4));
  CK(cudaMemcpy(dq, q.data(), nq * sizeof(S), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dk, k.data(), nq * sizeof(S), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, v.data(), nv * sizeof(S), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dg, g.data(), ng * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dh0, h0.data(), ns * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(dout, 0xff, nv * sizeof(S)));  // NaN in every dtype
  CK(cudaMemset(dht, 0xff, ns * 4));
  run_kernel<S, K>(dq, dk, dv, dg, use_h0 ? dh0 : nullptr, dout, dht, B, T, H, V, scale);
  CK(cudaDeviceSynchronize());
  std::vector<S> o(nv);
  std::vector<float> ht(ns);
  CK(cudaMemcpy(o.data(), dout, nv * sizeof(S), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ht.data(), dht, ns * 4, cudaMemcpyDeviceToHost));
  // float64 recurrence
  double eo = 0, ro = 0, eh = 0, rh = 0;
  bool nan = false;
  std::vector<double> Sd(size_t(K) * V);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < K * V; ++i) Sd[i] = use_h0 ? h0[(size_t(b) * H + h) * K * V + i] : 0.0;
      for (int t = 0; t < T; ++t) {
        const size_t bt = (size_t(b) * T + t) * H + h;
        const double d = std::exp(double(g[bt]));
        for (int kk = 0; kk < K; ++kk)
          for (int vv = 0; vv < V; ++vv)
            Sd[kk * V + vv] = d * Sd[kk * V + vv] + double(h_to(k[bt * K + kk])) * double(h_to(v[bt * V + vv]));
        for (int vv = 0; vv < V; ++vv) {
          double s = 0;
          for (int kk = 0; kk < K; ++kk) s += double(h_to(q[bt * K + kk])) * scale * Sd[kk * V + vv];
          const double x = h_to(o[bt * V + vv]);
          if (!std::isfinite(x)) nan = true;
          eo += (x - s) * (x - s);
          ro += s * s;
        }
      }
      for (int i = 0; i < K * V; ++i) {
        const double x = ht[(size_t(b) * H + h) * K * V + i];
        if (!std::isfinite(x)) nan = true;
        eh += (x - Sd[i]) * (x - Sd[i]);
        rh += Sd[i] * Sd[i];
      }
    }
  cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(dg); cudaFree(dh0); cudaFree(dht);
  *err_ht = nan ? INFINITY : std::sqrt(eh / std::max(rh, 1e-300));
  return nan ? INFINITY : std::sqrt(eo / std::max(ro, 1e-300));
}

template <typename S>
int check_all(const char* name, double thr, std::mt19937& rng) {
  int bad = 0;
  for (int KV = 0; KV < 4; ++KV)
    for (int T : {1, 63, 64, 65, 200})
      for (int use_h0 = 0; use_h0 < 2; ++use_h0) {
        const int K = KV & 1 ? 128 : 64, V = KV & 2 ? 128 : 64;
        double eh, eo = K == 64 ? check<S, 64>(2, T, 3, V, use_h0, rng, &eh) : check<S, 128>(2, T, 3, V, use_h0, rng, &eh);
        const bool ok = eo <= thr && eh <= thr;
        bad += !ok;
        if (!ok || (T == 200 && K == 128 && V == 128)) std::printf("%-5s K=%3d V=%3d T=%3d h0=%d  o %.2e  ht %.2e  %s\n", name, K, V, T, use_h0, eo, eh, ok ? "ok" : "FAIL");
      }
  return bad;
}

int main() {
  std::mt19937 rng(1234);
  int bad = 0;
  for (int bv : {64, 32}) {
    g_bv = bv;
    bad += check_all<float>("fp32", 1e-5, rng);
    bad += check_all<__nv_bfloat16>("bf16", 5e-3, rng);
    bad += check_all<__half>("fp16", 5e-3, rng);
    std::printf("correctness, V tile %d: %d failing configurations so far\n", bv, bad);
  }
  // timing: bf16, H=16, K=V=128, B·T = 65536, two input sets rotated
  for (int bv : {64, 32})
  for (int T : {2048, 8192, 32768}) {
    g_bv = bv;
    const int B = 65536 / T, H = 16, K = 128, V = 128;
    const size_t n = size_t(B) * T * H * K;
    __nv_bfloat16* buf[2][4];
    float *g[2], *ht;
    std::vector<__nv_bfloat16> table(65521), hst(n);
    std::normal_distribution<float> nd;
    for (auto& x : table) x = __float2bfloat16(nd(rng));
    for (size_t j = 0; j < n; ++j) hst[j] = table[j % table.size()];
    for (int s = 0; s < 2; ++s) {
      for (int i = 0; i < 4; ++i) {
        CK(cudaMalloc(&buf[s][i], n * 2));
        CK(cudaMemcpy(buf[s][i], hst.data() + (s * 4 + i), (n - 8) * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(buf[s][i] + (n - 8), hst.data(), 8 * 2, cudaMemcpyHostToDevice));
      }
      CK(cudaMalloc(&g[s], size_t(B) * T * H * 4));
      std::vector<float> gh(size_t(B) * T * H, -0.05f);
      CK(cudaMemcpy(g[s], gh.data(), gh.size() * 4, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&ht, size_t(B) * H * K * V * 4));
    for (int w = 0; w < 3; ++w) run_kernel<__nv_bfloat16, 128>(buf[w % 2][0], buf[w % 2][1], buf[w % 2][2], g[w % 2], nullptr, buf[w % 2][3], ht, B, T, H, V, 0.088f);
    CK(cudaDeviceSynchronize());
    std::vector<float> ms;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    for (int it = 0; it < 10; ++it) {
      const int s = it % 2;
      CK(cudaEventRecord(a));
      run_kernel<__nv_bfloat16, 128>(buf[s][0], buf[s][1], buf[s][2], g[s], nullptr, buf[s][3], ht, B, T, H, V, 0.088f);
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float x; CK(cudaEventElapsedTime(&x, a, b)); ms.push_back(x);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("timing bf16 V tile %d B=%d T=%d H=16 K=V=128: median %.3f ms (min %.3f)\n", g_bv, B, T, ms[5], ms[0]);
    for (int s = 0; s < 2; ++s) { for (int i = 0; i < 4; ++i) cudaFree(buf[s][i]); cudaFree(g[s]); }
    cudaFree(ht);
  }
  return bad ? 1 : 0;
}
