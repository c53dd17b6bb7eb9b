// Tensor-core kernels of the chunked linear-attention algorithm with a scalar log decay per head
// (`simple_gla` and `gated_delta_rule`), bf16 / fp16 inputs, fp32 accumulation. Plain C++ interface
// on raw device pointers (no LibTorch here) so the kernels can also be checked and timed outside the
// harness; mixers/linear/chunk_cuda.cpp wraps them into the ops' CUDA paths with autograd.
//
// Layout as flash-linear-attention: q, k, w [B,T,H,K]; v, u, o [B,T,H,V]; `b` is the cumulative sum
// of the log decay g inside each chunk of 64 tokens, fp32 [B,Tp,H] with Tp = 64·ceil(T/64) and g read
// as 0 past T; states [B,H,K,V] fp32; per-chunk states `hs` [B,H,NT,K,V] in the input dtype.
// All tensors contiguous and 16-byte aligned; K, V ∈ {64, 128}.
//
// Where they live (the chunked algorithm split by what is sequential):
//   chunk_walk.cu      walk_fwd, walk_bwd, walk_bwd_delta: one CTA per (b, h, V tile) walks the chunks;
//   chunk_forward.cu   chunk_output, fused_fwd, chunk_cumsum;
//   chunk_backward.cu  chunk_dqkv, decay_grad (gradients of every chunk in parallel);
//   chunk_wy.cu        delta_prep, delta_dv_local, delta_wy_bwd (the delta rule's WY form and its backward);
//   chunk_launch.cu    launch choices (Tuning), the layout probe, error checks; chunk_launch.cuh the
//                      launchers' shared dispatch;
//   chunk_tiles.cuh, chunk_state.cuh, chunk_scores.cuh, chunk_grad_rows.cuh  device primitives.
#pragma once

namespace mixbench::linear::tc {

enum class Dtype { BF16, FP16 };

struct Dims {
  int B, T, H, K, V;
};

inline int num_chunks(int T) { return (T + 63) / 64; }

// True when the kernels take these head dims.
bool supported(int K, int V);
// True when the accumulator-fragment layout the kernels' epilogues assume (that of mma.sync
// m16n8k16) holds on the current device; checked once with a probe kernel.
bool layout_ok();

// b = the cumulative sum of g (fp32 [B,T,H]) inside each chunk of 64 tokens, fp32 [B,Tp,H], g read as
// 0 past T.
void chunk_cumsum(const float* g, float* b, int B, int T, int H, void* stream);

// Forward state walk over the chunks of every (b, h). For chunk c, stores the state at the chunk start
// into hs[c], then (delta rule only, `w` non-null) computes v_new = u − w·S, rounds it to the input
// dtype and stores it into `vnew`, and updates S ← e^{b_L} S + (k ⊙ e^{b_L − b})ᵀ v_new (v_new = v for
// simple_gla). h0 may be null (zero state); the final state goes to ht.
void walk_fwd(Dtype dt, const void* k, const void* v, const void* w, const float* b, const float* h0, void* hs,
              void* vnew, float* ht, Dims d, void* stream);

// Forward in one kernel (no per-chunk states in global memory): o and ht of simple_gla (w null, v)
// or of the delta rule (w and u from delta_prep in place of v). h0 may be null.
void fused_fwd(Dtype dt, const void* q, const void* k, const void* v, const void* w, const float* b, const float* h0,
               void* o, float* ht, float scale, Dims d, void* stream);

// Which forward is faster on this device for these shapes (measured on an H200): the fused kernel
// keeps one CTA per SM busy for the whole walk, so it wins only when the heads alone fill the machine
// several times over; otherwise walk_fwd + chunk_output (states through global memory, all chunks'
// outputs in parallel).
bool prefer_fused(Dims d);

// Reverse walk of the state gradient for simple_gla: dS_NT = dht (null = 0); for c = NT−1 … 0 stores
// dS_{c+1} (the gradient of the state at the end of chunk c) into dhs[c], then
// dS_c = e^{b_L} dS_{c+1} + (scale·q ⊙ e^{b})ᵀ do. dh0 receives dS_0.
void walk_bwd(Dtype dt, const void* q, const void* d_o, const float* b, const float* dht, void* dhs, float* dh0,
              float scale, Dims d, void* stream);

// Reverse walk of the delta rule's state gradient (gated_delta_rule backward), given w (delta_prep)
// and dvl = Pᵀ do, the part of the gradient of v_new that does not depend on the state
// (P = scale·(q kᵀ) ⊙ e^{b_i − b_j} ⊙ [j ≤ i]), in the input dtype [B,T,H,V]. dS_NT = dht (null = 0);
// for c = NT−1 … 0: stores dS_{c+1} into dhs[c], du = dvl + e^{b_L − b} ⊙ (k dS_{c+1}) (rounded to
// the input dtype) into du, and dS_c = e^{b_L} dS_{c+1} + (scale·e^{b} ⊙ q)ᵀ do − wᵀ du. dh0 ← dS_0.
void walk_bwd_delta(Dtype dt, const void* q, const void* d_o, const void* k, const void* w, const void* dvl,
                    const float* b, const float* dht, void* dhs, void* du, float* dh0, float scale, Dims d,
                    void* stream);

// Output of every chunk, all chunks in parallel:
// o = scale·(q ⊙ e^{b}) h_c + (scale·(q kᵀ) ⊙ e^{b_i − b_j} ⊙ [j ≤ i]) v.
void chunk_output(Dtype dt, const void* q, const void* k, const void* v, const float* b, const void* hs, void* o,
                  float scale, Dims d, void* stream);

// Gradients of q, k, v of simple_gla for every chunk in parallel, given the forward states hs (state
// at chunk start) and the backward states dhs (gradient of the state at chunk end); dq, dk in fp32,
// dv in the input dtype. Also the pieces of the decay gradient, formed per chunk so that no large
// terms cancel across the sequence: y_j = k_j·dk_j^inter (fp32 [B,T,H]) and z_c = e^{b_L}⟨dh_c, h_c⟩
// (fp32 [B,NT,H]). With x_i = q_i·dq_i − k_i·dk_i + y_i, the gradient of g_t in chunk c is
//   dg_t = Σ_{i ≥ t in c} x_i + Σ_{j < t in c} y_j + z_c.
// With xdot (fp32 [B,T,H]) the kernel also forms the row dots q_i·dq_i − k_i·dk_i there (from the
// fp32 gradients) and writes dq in the input dtype into dq instead of dqf, and dk likewise into dk
// where dk is not null (into dkf otherwise); decay_grad then takes xdot in place of the gradients.
// dv may be null (the delta rule's backward has its value gradient already): neither dv nor A is formed.
void chunk_dqkv(Dtype dt, const void* q, const void* k, const void* v, const void* d_o, const float* b,
                const void* hs, const void* dhs, float* dqf, float* dkf, void* dv, float* y, float* z, float scale,
                Dims d, void* stream, void* dq = nullptr, void* dk = nullptr, float* xdot = nullptr);

// The decay gradient from chunk_dqkv's pieces (and delta_wy_bwd's x2, null for simple_gla), all
// chunks in parallel: x_i = q_i·dq_i − k_i·dk_i + y_i (+ x2_i), dg_t = Σ_{i ≥ t in c} x_i +
// Σ_{j < t in c} y_j + z_c into dg (fp32 [B,T,H]). dqf, dkf fp32 [B,T,H,K]; on the way they are
// rounded to the input dtype into dq / dk where those are not null. With xdot (chunk_dqkv's row
// dots) the dots come from there and q, dqf, k, dkf, dq, dk are not used (may be null).
void decay_grad(Dtype dt, const void* q, const float* dqf, const void* k, const float* dkf, const float* y,
                const float* z, const float* x2, float* dg, void* dq, void* dk, Dims d, void* stream,
                const float* xdot = nullptr);

// Delta-rule preparation of every chunk in parallel (WY / UT form): with
// A = tril(diag(β) (k kᵀ) ⊙ e^{b_i − b_j}, −1) and X = (I + A)⁻¹,
// w = X (β e^{b} ⊙ k) and u = X (β ⊙ v), rounded to the input dtype. beta fp32 [B,T,H]. When x is
// not null, X itself goes there in fp32, [B,H,NT,64,64] (for the backward).
void delta_prep(Dtype dt, const void* k, const void* v, const float* beta, const float* b, void* w, void* u, float* x,
                Dims d, void* stream);

// dvl = Pᵀ do for every chunk in parallel (P as in walk_bwd_delta), in the input dtype [B,T,H,V].
void delta_dv_local(Dtype dt, const void* q, const void* k, const void* d_o, const float* b, void* dvl, float scale,
                    Dims d, void* stream);

// Backward through delta_prep for every chunk in parallel, given du (the gradient of v_new, from
// walk_bwd_delta), the per-chunk states hs (walk_fwd), X (delta_prep's x output) and dk_in (fp32, the
// key gradient of the output and state-update products, from chunk_dqkv run with v_new as the values):
// with dw = −du S0ᵀ, dB_k = Xᵀ dw, dB_v = Xᵀ du, dA = −Xᵀ (dw B_kᵀ + du B_vᵀ) Xᵀ (strictly lower),
//   dk = dk_in + β e^{b} ⊙ dB_k + (E + Eᵀ) k (E = dA ⊙ e^{b_i − b_j} ⊙ β_i), dv = β ⊙ dB_v (input dtype),
//   dbeta (fp32 [B,T,H]) and x2 (fp32 [B,T,H]), the gradient of the cumulative gates b through
//   B_k and A (add it to chunk_dqkv's x_i before the per-chunk suffix sums that give dg).
void delta_wy_bwd(Dtype dt, const void* k, const void* v, const void* du, const void* hs, const float* x,
                  const float* beta, const float* b, const float* dk_in, void* dk, void* dv, float* dbeta, float* x2,
                  Dims d, void* stream);

// Launch choices for every later launch in the process, for measuring alternatives on a device
// (ci/kernels/chunk_check.py --sweep); 0 = the built-in rule, tuned on an H200.
struct Tuning {
  int walk_bv = 0;    // V tile of the state walks (walk_fwd, walk_bwd, walk_bwd_delta): 32 or 64
  int out_split = 0;  // CTAs per chunk and head in chunk_output for V = 128: 1 or 2 (V tiles of 64)
};
void set_tuning(const Tuning& t);

// Throws std::runtime_error naming `what` when the last launch failed.
void check_launch(const char* what);

}  // namespace mixbench::linear::tc
