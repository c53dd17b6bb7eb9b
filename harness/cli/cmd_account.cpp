// mixbench account: the accounting suite (suites/account.h) for one method, printed or as a report.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <iostream>

#include "harness/cli/commands.h"
#include "harness/cli/common.h"
#include "harness/errors.h"
#include "harness/report.h"
#include "suites/account.h"

namespace mixbench {

namespace {

using Json = nlohmann::json;

int run_account_command(const Args& a, const std::vector<std::string>& args) {
  auto name = a.get("method");
  if (!name) throw UsageError("account needs --method NAME");
  AccountOptions opt;
  opt.method = *name;
  opt.config = a.get_or("config", "");
  if (auto T = a.get("seq-len")) opt.config += (opt.config.empty() ? "" : ",") + std::string("seq_len=") + *T;
  if (a.get("context")) opt.context = a.get_int("context", 0);
  opt.dtype_bytes = a.get_int("dtype-bytes", 2);
  opt.audit = a.flag("audit");
  if (opt.audit) opt.audit_batch = a.get_int("batch", 1);
  const AccountResult res = run_account(opt);
  const Json& r = res.row;
  const ModelCost& mc = res.cost;
  const ModelDims& d = res.dims;
  const CostQuery& q = res.query;
  RunInfo info = run_info("account", args);
  info.config = res.config.to_json();
  Json report = make_report(info, Json::array({r}));
  if (auto out = a.get("out")) write_report(*out, report);
  if (a.flag("json")) {
    std::cout << report.dump(2) << "\n";
  } else {
    std::cout << fmt::format("method {}  (L={}, d={}, H={}, dh={}, T={}, vocab={})\n", res.method->name, d.n_layer,
                             d.d_model, d.n_head, d.head_dim, q.T, d.vocab);
    std::cout << fmt::format("params: total {}  (wte {}, value_embeds {}, lm_head {}, transformer_matrices {}, scalars {}; matmul {})\n",
                             mc.params.total(), mc.params.wte, mc.params.value_embeds, mc.params.lm_head,
                             mc.params.transformer_matrices, mc.params.scalars, mc.params.matmul);
    std::cout << fmt::format("training FLOPs/token (nanochat: 6·N_matmul + Σ core): {:.4e}\n", mc.train_flops_nanochat);
    std::cout << fmt::format("forward FLOPs/token (executed, causal pairs exact):   {:.4e}\n", mc.fwd_flops);
    std::cout << fmt::format("decode FLOPs/token at context {}:                    {:.4e}\n", q.context, mc.decode_flops);
    if (mc.aux_route_fwd_flops > 0)
      std::cout << fmt::format("auxiliary routes' forward FLOPs/token (training):     {:.4e}\n", mc.aux_route_fwd_flops);
    std::cout << fmt::format("activation bytes/token: {:.4g}   KV cache bytes/token: {:.4g}   fixed state bytes: {:.4g}\n",
                             mc.act_bytes, mc.cache_bytes_per_token, mc.state_bytes);
    if (r.contains("indexer_share"))
      std::cout << fmt::format("indexer share of its layer's training FLOPs (MLP excluded): {:.4f}\n",
                               r["indexer_share"].get<double>());
    if (r.contains("audit"))
      std::cout << fmt::format("audit: built params {} ({}), counted fwd FLOPs/token {:.4e} (rel diff {:.2e})\n",
                               r["audit"]["params_built"]["total"].get<int64_t>(),
                               r["audit"]["params_match"].get<bool>() ? "match" : "MISMATCH",
                               r["audit"]["fwd_flops_counted_per_token"].get<double>(),
                               r["audit"]["fwd_flops_rel_diff"].get<double>());
    if (r.contains("audit") && r["audit"].contains("aux_route_fwd_flops_rel_diff"))
      std::cout << fmt::format("audit: counted auxiliary-route FLOPs/token {:.4e} (rel diff of the pass running them {:.2e})\n",
                               r["audit"]["aux_route_fwd_flops_counted_per_token"].get<double>(),
                               r["audit"]["aux_route_fwd_flops_rel_diff"].get<double>());
  }
  return res.audit_passed() ? 0 : 1;
}

}  // namespace

Command account_command() {
  return {"account",
          "parameters, FLOPs/token, decode FLOPs, activation and cache bytes of a method's model",
          "",
          "with --audit: exit 1 when the built model's parameters or counted forward FLOPs (beyond 2%) disagree",
          {{"method", OptionKind::Value, "NAME", "the registered method to account (required)"},
           {"seq-len", OptionKind::Value, "T", "sequence length (sets the config's seq_len)"},
           {"context", OptionKind::Value, "C", "decode context length (default: the sequence length)"},
           {"config", OptionKind::Value, "k=v,...", "overrides of the method's config"},
           {"dtype-bytes", OptionKind::Value, "N", "element size of activations, caches and states (default 2)"},
           {"audit", OptionKind::Flag, "", "build the model on the CPU, count its parameters and its forward FLOPs"},
           {"batch", OptionKind::Value, "B", "rows of the audit's forward pass (default 1)"},
           {"json", OptionKind::Flag, "", "print the JSON report instead of the summary"},
           {"out", OptionKind::Value, "FILE", "write the JSON report"}},
          run_account_command};
}

}  // namespace mixbench
