// The decode kernels' environment settings, read when a kernel is launched (a captured step keeps
// what it was captured with). A value outside the accepted ones throws InputError naming it.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace mixbench {

// MIXBENCH_DECODE_GEMV_ROWS: the most rows the GEMV kernels (linear_relu_square,
// residual_norm_linear, linear_rows) take on a GPU: 0..8, 0 when unset (every product through
// at::linear, after residual_norm where the op is residual_norm_linear: on an H200 the d12 step is
// faster so at batch 1 and at batch 8), to compare the two paths at a batch size.
int64_t decode_gemv_max_rows();

// MIXBENCH_DECODE_PDL: whether the decode step's own kernels are launched as programmatic dependent
// launches (harness/pdl.cuh): unset or 1 yes, 0 no.
bool decode_pdl_enabled();

// MIXBENCH_DECODE_SPLIT_MIN: the fewest cache slots one split of the split-KV attention kernel
// takes (mixers/attention/decode_attention_kernel.h, choose_splits): 16 when unset; 16, 32, 64, 128
// or 256. Fewer slots per split: more blocks in flight over a short cache, more partials to merge.
int64_t decode_split_min_slots();

// MIXBENCH_DECODE_SPLIT_BY: the rows (heads × batch) the split-KV attention's split count divides
// about eight blocks per multiprocessor among: "kv" (B·Hkv rows of KV heads, each block taking every
// query head of its group), "query" (B·H rows: fewer, longer splits for grouped heads, fewer partials
// for the in-launch merge) or "auto" (unset: max(B·Hkv, H)). On an H200 at d12 (H = 6), bf16:
// B = 1 wants query (gqa, Hkv = 3: 0.67 against 0.82 ms at 8K; mqa: 0.98 against 1.61 ms), B = 8
// kv for mqa (2.90 against 4.42 ms at 32K) and about either for gqa (1.29 and 1.24 ms at 8K);
// auto takes the query heads while the KV rows are fewer than one batch's query heads.
std::string decode_split_by();
// The rows decode_split_by() counts for B sequences of H query and Hkv KV heads.
int64_t decode_split_rows(int64_t B, int64_t H, int64_t Hkv);

// MIXBENCH_DECODE_ARGMAX_KERNEL: whether a captured decode step's greedy token comes from the one-launch
// kernel of greedy_tokens_into (harness/decode_ops.h): unset or 1 yes, 0 no (at::argmax and a copy).
bool decode_argmax_kernel_enabled();

// The settings above as a captured decode point's report fields (the sweep's cache object, see
// reports/report.schema.json): gemv_max_rows, programmatic_launches, split_min_slots, split_by,
// argmax_kernel.
nlohmann::json decode_knobs_json();

}  // namespace mixbench
