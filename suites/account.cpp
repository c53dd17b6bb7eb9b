#include "suites/account.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "harness/cost_parts.h"
#include "harness/flop_counter.h"

namespace mixbench {

using Json = nlohmann::json;

Json param_json(const ParamCount& p) {
  return {{"wte", p.wte},         {"value_embeds", p.value_embeds}, {"lm_head", p.lm_head},
          {"transformer_matrices", p.transformer_matrices}, {"scalars", p.scalars},
          {"total", p.total()},   {"matmul", p.matmul}};
}

double layer_train_flops(const LayerCost& lc) { return 6.0 * double(lc.params.matmul) + lc.nanochat_core_flops; }

bool AccountResult::audit_passed() const {
  if (!row.contains("audit")) return true;
  const Json& a = row["audit"];
  if (!a["params_match"].get<bool>() || a["fwd_flops_rel_diff"].get<double>() > 0.02) return false;
  return !a.contains("aux_route_fwd_flops_rel_diff") || a["aux_route_fwd_flops_rel_diff"].get<double>() <= 0.02;
}

AccountResult run_account(const AccountOptions& opt) {
  AccountResult res;
  const MethodSpec& m = Registry::get().method(opt.method);
  res.method = &m;
  res.config = m.config.parse(opt.config);
  const Config& cfg = res.config;
  CostQuery& q = res.query;
  q.T = cfg.i("seq_len");
  q.context = opt.context ? *opt.context : q.T;
  q.dtype_bytes = opt.dtype_bytes;
  res.cost = account_model(m, cfg, q);
  res.dims = model_dims(cfg);
  const ModelCost& mc = res.cost;
  const ModelDims& d = res.dims;
  Json r = {{"status", "ok"},
            {"method", m.name},
            {"config", cfg.to_json()},
            {"shape", {{"n_layer", d.n_layer}, {"d_model", d.d_model}, {"n_head", d.n_head}, {"head_dim", d.head_dim},
                       {"seq_len", q.T}, {"context", q.context}, {"vocab", d.vocab}}},
            {"params", param_json(mc.params)},
            {"train_flops_per_token_nanochat", mc.train_flops_nanochat},
            {"fwd_flops_per_token", mc.fwd_flops},
            {"decode_flops_per_token", mc.decode_flops},
            {"activation_bytes_per_token", mc.act_bytes},
            {"kv_cache_bytes_per_token", mc.cache_bytes_per_token},
            {"state_bytes_per_sequence", mc.state_bytes},
            {"dtype_bytes", q.dtype_bytes}};
  if (mc.aux_route_fwd_flops > 0) r["aux_route_fwd_flops_per_token"] = mc.aux_route_fwd_flops;
  Json layers = Json::array();
  const ExecPlan plan = model_plan(m, cfg);
  const std::vector<LayerMethod> lm = layer_methods(m, cfg);
  double indexer_share = -1;
  // one row per plan step: "layer" is the step's parameter block; a looped plan adds the step and
  // the block's application ("iteration"), an auxiliary route's step its "route"; a layer with an indexer adds its training FLOPs and share
  for (size_t i = 0; i < mc.layers.size(); ++i) {
    const PlanStep& st = mc.steps[i];
    const LayerCost& lc = mc.layers[i];
    layers.push_back({{"layer", st.block}, {"method", lm[size_t(st.block)].method->name},
                      {"params", lc.params.total()}, {"fwd_flops", lc.fwd_flops},
                      {"nanochat_core_flops", lc.nanochat_core_flops}, {"formula", lc.formula}});
    if (m.plan) {
      layers.back()["step"] = i;
      layers.back()["iteration"] = st.iteration;
      if (st.route > 0) layers.back()["route"] = st.route;
    }
    const LayerMethod& l = lm[size_t(st.block)];
    if (const LayerCostPart* part = layer_cost_part(l.method->name, "indexer")) {
      const ExecPlan::RoutePos rp = plan.route_pos(int64_t(i));
      const LayerCtx ctx{st.block, d.n_layer, -1, st.iteration, st.n_iterations, rp.index, rp.length};
      const double flops = (*part)(l.cfg, ctx, q);
      const double share = flops / layer_train_flops(lc);
      layers.back()["indexer_train_flops"] = flops;
      layers.back()["indexer_share"] = share;
      indexer_share = std::max(indexer_share, share);
    }
  }
  r["layers"] = layers;
  if (indexer_share >= 0) r["indexer_share"] = indexer_share;
  if (opt.audit) {
    // Build the model and count what it holds and executes.
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);
    Model model = build_model(m, cfg, gen, at::TensorOptions().dtype(at::kFloat), true);
    ParamCount built = count_params(model);
    const int64_t B = opt.audit_batch;
    at::Tensor idx = at::randint(d.vocab, {B, q.T}, gen, at::TensorOptions().dtype(at::kLong));
    double counted = 0;
    {
      c10::NoGradGuard ng;
      FlopCounter fc;
      model_forward(model, idx, Backend::CPU);
      counted = fc.total() / double(B * q.T) + mc.uncounted_flops;
    }
    r["audit"] = {{"params_built", param_json(built)},
                  {"params_match", built.total() == mc.params.total() && built.matmul == mc.params.matmul &&
                                       built.transformer_matrices == mc.params.transformer_matrices},
                  {"fwd_flops_counted_per_token", counted},
                  {"fwd_flops_documented_uncounted_per_token", mc.uncounted_flops},
                  {"fwd_flops_rel_diff", std::abs(counted - mc.fwd_flops) / mc.fwd_flops}};
    if (plan.has_aux_routes()) {
      // a pass collecting the auxiliary losses runs the auxiliary routes too (training's forward)
      double with_aux = 0;
      {
        c10::NoGradGuard ng;
        FlopCounter fc;
        ModelAux aux;
        model_forward(model, idx, Backend::CPU, &aux);
        with_aux = fc.total() / double(B * q.T) + mc.uncounted_flops + mc.aux_route_uncounted_flops;
      }
      const double want = mc.fwd_flops + mc.aux_route_fwd_flops;
      r["audit"]["aux_route_fwd_flops_counted_per_token"] = with_aux - counted;
      r["audit"]["aux_route_fwd_flops_rel_diff"] = std::abs(with_aux - want) / want;
    }
  }
  res.row = std::move(r);
  return res;
}

}  // namespace mixbench
