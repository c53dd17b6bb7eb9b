#include "suites/budgets.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <stdexcept>

#include "harness/errors.h"
#include "harness/registry.h"
#include "suites/rank_agreement.h"
#include "suites/train.h"

namespace mixbench {

using Json = nlohmann::json;

std::string Budget::str() const {
  switch (kind) {
    case Kind::Steps: return fmt::format("steps={}", int64_t(value));
    case Kind::TokensPerParam: return fmt::format("tpp={}", value);  // the shortest exact form: runs re-read it
    case Kind::Flops: return fmt::format("flops={}", value);
  }
  return "";
}

Budget parse_budget(const std::string& text) {
  const auto eq = text.find('=');
  const std::string key = text.substr(0, eq), val = eq == std::string::npos ? "" : text.substr(eq + 1);
  Budget b;
  if (key == "tpp") b.kind = Budget::Kind::TokensPerParam;
  else if (key == "flops") b.kind = Budget::Kind::Flops;
  else if (key == "steps") b.kind = Budget::Kind::Steps;
  else throw UsageError(fmt::format("budget '{}': expected tpp=X (tokens per parameter), flops=Y or steps=N", text));
  size_t used = 0;
  try {
    b.value = std::stod(val, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (val.empty() || used != val.size() || !(b.value > 0) || !std::isfinite(b.value))
    throw UsageError(fmt::format("budget '{}': '{}' is not a positive number", text, val));
  if (b.kind == Budget::Kind::Steps && b.value != std::floor(b.value))
    throw UsageError(fmt::format("budget '{}': steps are a whole number", text));
  return b;
}

Budget budget_from_json(const nlohmann::ordered_json& j, const std::string& preset) {
  Budget b;
  if (j.is_object() && j.size() == 1 && j.contains("tokens_per_param") && j["tokens_per_param"].is_number()) {
    b.kind = Budget::Kind::TokensPerParam;
    b.value = j["tokens_per_param"].get<double>();
  } else if (j.is_object() && j.size() == 1 && j.contains("flops") && j["flops"].is_number()) {
    b.kind = Budget::Kind::Flops;
    b.value = j["flops"].get<double>();
  } else {
    throw std::logic_error("preset " + preset + ": budget is {\"tokens_per_param\": X} or {\"flops\": Y}");
  }
  if (!(b.value > 0)) throw std::logic_error("preset " + preset + ": the budget must be positive");
  return b;
}

Json BudgetPlan::to_json() const {
  return {{"budget", budget.str()},     {"anchor", anchor},  {"anchor_params", anchor_params},
          {"anchor_flops_per_token", anchor_flops_per_token}, {"target_tokens", target_tokens},
          {"steps", steps},             {"tokens", tokens}};
}

BudgetPlan plan_budget(const Budget& b, const TrainPreset& p, int64_t batch, const std::string& extra_config) {
  const MethodSpec& anchor = Registry::get().method(p.anchor);
  // the overrides the anchor takes (a method's own knobs, e.g. a sparse method's top-k, are not its)
  std::string own;
  for (size_t a = 0; a < extra_config.size();) {
    size_t b = extra_config.find(',', a);
    if (b == std::string::npos) b = extra_config.size();
    const std::string kv = extra_config.substr(a, b - a);
    if (anchor.config.find(kv.substr(0, kv.find('='))) != nullptr) own += "," + kv;
    a = b + 1;
  }
  const Config cfg = anchor.config.parse(p.config_for(anchor.name) + own);
  const int64_t T = model_dims(cfg).seq_len;
  CostQuery q;
  q.T = T;
  const ModelCost cost = account_model(anchor, cfg, q);
  BudgetPlan plan;
  plan.budget = b;
  plan.anchor = anchor.name;
  plan.anchor_params = cost.params.transformer_matrices + cost.params.lm_head;
  plan.anchor_flops_per_token = cost.train_flops_nanochat;
  const double row_tokens = double(batch * T);
  switch (b.kind) {
    case Budget::Kind::Steps: plan.target_tokens = b.value * row_tokens; break;
    case Budget::Kind::TokensPerParam: plan.target_tokens = b.value * double(plan.anchor_params); break;
    case Budget::Kind::Flops: plan.target_tokens = b.value / plan.anchor_flops_per_token; break;
  }
  plan.steps = std::max<int64_t>(1, int64_t(std::llround(plan.target_tokens / row_tokens)));
  plan.tokens = plan.steps * batch * T;
  return plan;
}

BudgetPlan run_length(const TrainOptions& o, const TrainPreset& p) {
  const int64_t B = o.batch > 0 ? o.batch : p.batch;
  Budget b;
  if (o.steps > 0) b.value = double(o.steps);
  else if (!o.budget.empty()) b = parse_budget(o.budget);
  else if (p.budget) b = *p.budget;
  else b.value = double(p.steps);
  return plan_budget(b, p, B, o.anchor_config ? *o.anchor_config : o.config);
}

std::vector<TrainResult> run_budgets(const TrainOptions& base, const std::vector<Budget>& budgets) {
  if (budgets.empty()) throw UsageError("no budget to train to");
  const TrainPreset P = train_preset(base.preset);
  TrainOptions plain = base;
  plain.steps = 0;
  plain.stop_after = 0;
  plain.out.clear();
  plain.resume = false;
  plain.start_from = nullptr;
  plain.snapshot_at = 0;
  plain.snapshot_out = nullptr;
  const size_t n = budgets.size();
  std::vector<TrainOptions> runs(n, plain);
  std::vector<BudgetPlan> plans(n);
  std::vector<int64_t> steps(n);
  for (size_t i = 0; i < n; ++i) {
    runs[i].budget = budgets[i].str();
    plans[i] = run_length(runs[i], P);
    steps[i] = plans[i].steps;
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return steps[a] < steps[b]; });
  // The sparse methods' full-attention warm-up is a fraction of a run: the runs share the shortest
  // run's, so that they are the same run until a branch point.
  const MethodSpec& ms = Registry::get().method(base.method);
  const Config shortest = resolve_full_attention_warmup(
      ms.config.parse(P.config_for(ms.name) + (base.config.empty() ? "" : "," + base.config)), steps[order.front()]);
  if (shortest.has("full_attention_warmup_steps"))
    for (auto& r : runs)
      r.config += (r.config.empty() ? "" : ",") +
                  fmt::format("full_attention_warmup_steps={}", shortest.i("full_attention_warmup_steps"));
  const size_t longest = order.back();
  auto schedule = [&](int64_t s) {
    Schedule sc = P.hyper.schedule;
    sc.steps = s;
    return sc;
  };
  std::vector<TrainResult> results(n);
  std::vector<bool> have(n, false);
  RunSnapshot snap;
  int64_t trunk_at = 0;  // the step the snapshot holds (0: none yet)
  for (size_t i : order) {
    if (steps[i] == steps[longest]) continue;
    // The shorter run ends with its own last step, evaluation and probes.
    // (and before the shorter run's exit-gate-only stage, where a method has one)
    const int64_t branch = std::min({first_schedule_difference(schedule(steps[i]), schedule(steps[longest]),
                                                               P.hyper.muon_wd),
                                     steps[i] - 1, gate_stage_start(ms, shortest, P, steps[i])});
    if (branch < trunk_at) {  // the longer run is past the branch point: this budget runs alone
      results[i] = run_train(runs[i]);
      have[i] = true;
      continue;
    }
    if (branch > trunk_at) {
      TrainOptions t = runs[longest];
      t.start_from = trunk_at > 0 ? &snap : nullptr;
      RunSnapshot next;
      t.snapshot_at = branch;
      t.snapshot_out = &next;
      run_train(t);
      snap = std::move(next);
      trunk_at = branch;
    }
    runs[i].start_from = trunk_at > 0 ? &snap : nullptr;
    results[i] = run_train(runs[i]);
    have[i] = true;
  }
  runs[longest].start_from = trunk_at > 0 ? &snap : nullptr;
  results[longest] = run_train(runs[longest]);
  for (size_t i = 0; i < n; ++i)
    if (!have[i] && i != longest) {  // another budget of the longest's steps: the same run
      results[i] = results[longest];
      results[i].budget = plans[i];
    }
  return results;
}

Json budget_rankings(const Json& rows) {
  std::vector<std::string> labels;
  std::map<std::string, Json> info;
  std::map<std::string, std::map<std::string, double>> ranks;  // budget -> method -> validation loss
  for (const auto& r : rows) {
    if (!r.contains("budget") || !r["budget"].is_object()) continue;
    const Json& b = r["budget"];
    const std::string label = b.at("budget").get<std::string>();
    Json& entry = info[label];
    if (entry.is_null()) {
      labels.push_back(label);
      entry = {{"budget", label}, {"steps", nullptr}, {"tokens", nullptr}};
    }
    if (entry["steps"].is_null() && b.contains("steps")) {  // an error row knows no steps
      entry["steps"] = b["steps"];
      entry["tokens"] = b["tokens"];
    }
    // ordered by the (mean) validation loss: lower is better, as the ranks are
    const char* key = r.contains("val_bpb") ? "val_bpb" : "val_bits_per_token";
    if (r.value("status", "") == "ok" && r.contains(key) && r[key].is_number())
      ranks[label][r["method"].get<std::string>()] = r[key].get<double>();
  }
  Json out = {{"budgets", Json::array()}, {"kendall_tau", Json::array()}};
  for (const auto& label : labels) {
    std::vector<std::pair<double, std::string>> by_rank;
    for (const auto& [m, k] : ranks[label]) by_rank.emplace_back(k, m);
    std::sort(by_rank.begin(), by_rank.end());
    Json j = info[label];
    j["ranking"] = Json::array();
    for (const auto& [k, m] : by_rank) j["ranking"].push_back(m);
    out["budgets"].push_back(j);
  }
  for (size_t i = 0; i < labels.size(); ++i)
    for (size_t k = i + 1; k < labels.size(); ++k) {
      std::vector<double> a, b;
      for (const auto& [m, r] : ranks[labels[i]]) {
        auto it = ranks[labels[k]].find(m);
        if (it == ranks[labels[k]].end()) continue;
        a.push_back(double(r));
        b.push_back(double(it->second));
      }
      const double tau = kendall_tau(a, b);
      out["kendall_tau"].push_back({{"a", labels[i]}, {"b", labels[k]}, {"methods", int64_t(a.size())},
                                    {"tau", std::isnan(tau) ? Json() : Json(tau)}});
    }
  return out;
}

}  // namespace mixbench
