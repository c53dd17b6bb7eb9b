// Split-KV attention for one query token per row over a preallocated KV cache (flash-decoding):
// the C entry point of mixers/attention/decode_attention_kernel.cu. The number of valid cache
// slots is read on the device (n = min(*pos + 1, cap)), so a captured CUDA graph replays it at any
// position; the LibTorch wrapper is attention_decode_static (mixers/attention/decode_attention.cpp).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "mixers/common/rope_kernel.h"

namespace mixbench::attn_decode_cuda {

using Dtype = layers::rope_cuda::Dtype;  // the element types every fused kernel here takes

// Head dimensions the kernel is built for (others take the LibTorch path).
bool supported_head_dim(int D);
// Key splits for B·Hkv rows over `cap` slots on a GPU with `sms` multiprocessors: about eight blocks
// per multiprocessor, none shorter than `min_slots` slots at full capacity, at most 1024.
int choose_splits(int B, int Hkv, int cap, int sms, int min_slots);
// fp32 workspace the kernel needs: splits · B · H · (D + 2).
int64_t workspace_floats(int B, int H, int D, int splits);
// The arrival counters one launch uses: B · H unsigned ints, zero before the first launch; every
// launch leaves them zero again (so one buffer serves every launch on a stream, one at a time).
int64_t counter_slots(int B, int H);
// o[b,h] = Σ_j softmax_j(scale · s · q[b,h]·K[b,j,h/G]) V[b,j,h/G] over the first n = min(pos + 1, cap)
// slots, pos = *pos_dev, s = log(pos + a) / log(a) when logit_a > 0 (else 1), G = H / Hkv.
// q, o [B,H,D]; K, V [B,cap,Hkv,D]; all contiguous, of type dt. One kernel launch of `splits` splits
// (choose_splits for the capacity), of which those the live context n fills with min_slots slots
// each, ⌈n / min_slots⌉ at most, take the slots and are merged: a captured step over a cache
// preallocated for a long context merges few partials while the context is short.
void decode(Dtype dt, const void* q, const void* K, const void* V, void* o, const int64_t* pos_dev, int B, int H, int Hkv,
            int D, int cap, float scale, double logit_a, float* workspace, int splits, int min_slots, unsigned* counters,
            cudaStream_t stream);

// The same over listed slots: keys [B, key_rows, n_keys] int64 (key_rows 1: one list for every KV
// head of the row; Hkv: one per KV head), a negative entry or one ≥ cap naming no slot; the listed
// slots split over `splits` (choose_splits over n_keys). A list with no slot gives NaN, as a softmax
// over no key does. pos_dev is read only for the logit scale (logit_a > 0; may be null otherwise).
void decode_listed(Dtype dt, const void* q, const void* K, const void* V, void* o, const int64_t* pos_dev,
                   const int64_t* keys, int n_keys, int key_rows, int B, int H, int Hkv, int D, int cap, float scale,
                   double logit_a, float* workspace, int splits, int min_slots, unsigned* counters, cudaStream_t stream);

}  // namespace mixbench::attn_decode_cuda
