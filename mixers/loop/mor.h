// Mixture-of-Recursions with expert-choice routing (arXiv 2507.10524; raymin0223/mixture_of_recursions,
// model/mor_model/expert_choice_router.py), as the residual stream of `mor`. The routing arithmetic
// is exposed for tests.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "harness/config.h"

namespace mixbench::mor {

// The original's defaults (conf/pretrain/…_rec3_middle_cycle_…_mor_expert_linear_alpha_0.1_sigmoid_aux_loss_0.001.yaml:
// mor.expert.alpha 0.1, router_func sigmoid, router_type linear (no bias, N(0, 0.02) init),
// temp 1.0, sampling aux_loss with coeff 0.001; util/config.py: capacity null → (N_r − r)/N_r).
constexpr double kAlpha = 0.1;
constexpr double kAuxCoeff = 0.001;
constexpr double kRouterInitStd = 0.02;

// The capacity of each recursion: the config's "capacity" list ("c_0,c_1,…", one per recursion,
// each in (0, 1], non-increasing) or, when empty, the original's default (N_r − r)/N_r.
// InputError names a bad list.
std::vector<double> capacities(const Config& c);
// Tokens recursion r processes in a sequence of T: max(1, ⌊c_r·T⌋) (the original's
// max(1, int(capacity_factor · seq_len)): a fraction of the whole sequence, chosen among the
// tokens the previous recursion processed).
int64_t tokens_at(double capacity, int64_t T);
// Expert-choice selection: the positions (ascending, [B,k] int64) of the k largest router logits
// z [B,n] of each row. Ties break toward the earlier position; the reference applies the same rule.
// Selecting on the logits equals the original's top-k on α·σ(z) (σ is increasing) without the
// ties σ's rounding makes among large logits.
at::Tensor select_top(const at::Tensor& z, int64_t k);

}  // namespace mixbench::mor
