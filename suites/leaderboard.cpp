#include "suites/leaderboard.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "harness/errors.h"
#include "harness/registry.h"
#include "suites/train.h"

namespace mixbench {

using Json = nlohmann::json;

Calibration calibrate(const std::string& method, const std::string& preset, const std::string& extra) {
  const TrainPreset P = train_preset(preset);
  auto cfg_text = [&](const std::string& shape, const std::string& m) {
    std::string s = P.config_for(m) + "," + shape;
    if (!extra.empty()) s += "," + extra;
    return s;
  };
  const MethodSpec& anchor = Registry::get().method(P.anchor);
  Config acfg = anchor.config.parse(cfg_text("", anchor.name));
  const ModelDims ad = model_dims(acfg);
  CostQuery q;
  q.T = ad.seq_len;
  const double F = account_model(anchor, acfg, q).train_flops_nanochat;
  const MethodSpec& ms = Registry::get().method(method);
  ms.config.parse(cfg_text("", method));  // a bad extra override is reported as itself, not as "no shape fits"
  Calibration best;
  best.method = method;
  best.anchor_flops = F;
  bool have = false;
  // Distance of a shape from the anchor's: layers, width in head_dim steps, and the MLP's departure
  // from nanochat's 4·d in steps of 4·head_dim (what one head_dim of width changes it by).
  auto shape_dist = [&](int64_t L, int64_t D, int64_t M) {
    return double(std::abs(L - ad.n_layer)) + double(std::abs(D - ad.d_model)) / double(ad.head_dim) +
           (M == 0 ? 0.0 : double(std::abs(M - 4 * D)) / double(4 * ad.head_dim));
  };
  // Candidates ordered: within ±2% first; among those the nearest shape, then the smallest residual;
  // outside ±2% the smallest residual. Returns the FLOPs/token, or NaN for a shape the method refuses.
  auto consider = [&](int64_t L, int64_t D, int64_t M) {
    std::string shape = fmt::format("n_layer={},d_model={}", L, D);
    if (M != 0) shape += fmt::format(",mlp_hidden={}", M);
    Config c;
    try {
      c = ms.config.parse(cfg_text(shape, method));
    } catch (const InputError&) {
      return std::nan("");  // a shape this method cannot take
    }
    const double f = account_model(ms, c, q).train_flops_nanochat;
    const double res = f / F - 1.0;
    const bool within = std::abs(res) <= 0.02;
    bool better;
    if (!have) better = true;
    else if (within != best.within) better = within;
    else if (within) {
      const double x = shape_dist(L, D, M), y = shape_dist(best.n_layer, best.d_model, best.mlp_hidden);
      better = x < y || (x == y && std::abs(res) < std::abs(best.residual));
    } else better = std::abs(res) < std::abs(best.residual);
    if (better) {
      have = true;
      best.n_layer = L;
      best.d_model = D;
      best.mlp_hidden = M;
      best.flops = f;
      best.residual = res;
      best.within = within;
      best.config = shape;
    }
    return f;
  };
  // For each depth/width: nanochat's MLP, then the MLP widths (multiples of head_dim in [2d, 6d])
  // next to the one that would meet the anchor exactly — the MLP's 2·d·M matmul parameters per layer
  // cost 6 FLOPs each per token, so the FLOPs are linear in M.
  for (int64_t L = 1; L <= 2 * ad.n_layer; ++L)
    for (int64_t D = ad.head_dim; D <= 2 * ad.d_model; D += ad.head_dim) {
      const double f4 = consider(L, D, 0);
      if (std::isnan(f4)) continue;
      const double m_exact = 4.0 * double(D) + (F - f4) / (12.0 * double(L) * double(D));
      const int64_t lo = int64_t(std::floor(m_exact / double(ad.head_dim))) * ad.head_dim;
      for (int64_t M : {lo, lo + ad.head_dim})
        if (M >= 2 * D && M <= 6 * D && M != 4 * D) consider(L, D, M);
    }
  if (!have) throw InputError(fmt::format("no shape of the calibration grid is valid for method '{}'", method));
  return best;
}

namespace {
// Ranks the rows by validation loss, adds the paired difference against the preset's baseline, and
// returns the Markdown tables.
std::string rank_rows(Json& results, const TrainPreset& P);
}  // namespace

Json run_leaderboard(const LeaderboardOptions& opt, std::string& md, Json* per_budget) {
  const TrainPreset P = train_preset(opt.preset);
  std::vector<std::string> methods = opt.methods;
  const bool all = (methods.size() == 1 && methods[0] == "all") || (methods.empty() && P.lineup.empty());
  if (all) {
    // the baseline and the anchor first, then every other registered method in registry order
    methods = {P.baseline};
    if (P.anchor != P.baseline) methods.push_back(P.anchor);
    for (const auto* m : Registry::get().methods())
      if (m->name != P.baseline && m->name != P.anchor) methods.push_back(m->name);
  } else if (methods.empty()) {
    methods = P.lineup;
  }
  for (const auto& m : methods) Registry::get().method(m);  // unknown names fail first
  const size_t n_budgets = std::max<size_t>(1, opt.budgets.size());
  std::vector<Json> by_budget(n_budgets, Json::array());
  for (const auto& m : methods) {
    Calibration cal = calibrate(m, opt.preset, opt.config);
    TrainOptions to;
    to.method = m;
    to.preset = opt.preset;
    to.config = cal.config + (opt.config.empty() ? "" : "," + opt.config);
    to.steps = opt.steps;
    to.budget = opt.budget;
    to.anchor_config = opt.config;
    to.batch = opt.batch;
    to.micro_batch = opt.micro_batch;
    to.seed = opt.seed;
    to.data = opt.data;
    to.progress = opt.progress;
    to.probe_sequences = opt.probe_sequences;
    to.device = opt.device;
    std::vector<Json> rows(n_budgets);
    try {
      std::vector<TrainResult> trs = opt.budgets.size() > 1 ? run_budgets(to, opt.budgets) : std::vector<TrainResult>{};
      if (opt.budgets.size() == 1) to.budget = opt.budgets[0].str();
      if (trs.empty()) trs.push_back(run_train(to));
      for (size_t k = 0; k < n_budgets; ++k) rows[k] = train_result_json(trs[k]);
    } catch (const UsageError&) {
      throw;
    } catch (const c10::Error& e) {  // e.g. CUDA out of memory: the message, not LibTorch's backtrace
      for (size_t k = 0; k < n_budgets; ++k) rows[k] = {{"status", "error"}, {"method", m}, {"message", e.what_without_backtrace()}};
    } catch (const std::exception& e) {
      for (size_t k = 0; k < n_budgets; ++k) rows[k] = {{"status", "error"}, {"method", m}, {"message", e.what()}};
    }
    for (size_t k = 0; k < n_budgets; ++k) {
      Json& row = rows[k];
      if (!opt.budgets.empty() && !row.contains("budget")) row["budget"] = {{"budget", opt.budgets[k].str()}};
      row["calibration"] = {{"n_layer", cal.n_layer}, {"d_model", cal.d_model},
                            {"mlp_hidden", cal.mlp_hidden ? cal.mlp_hidden : 4 * cal.d_model}, {"flops_per_token", cal.flops},
                            {"anchor_flops_per_token", cal.anchor_flops}, {"residual", cal.residual},
                            {"within_2pct", cal.within}};
      by_budget[k].push_back(row);
    }
  }
  Json results = Json::array();
  md.clear();
  for (size_t k = 0; k < n_budgets; ++k) {
    if (n_budgets > 1) {
      const Json& b = by_budget[k][0]["budget"];
      md += fmt::format("{}## budget {}{}\n\n", k ? "\n" : "", b["budget"].get<std::string>(),
                        b.contains("steps") ? fmt::format(" ({} steps, {} tokens)", b["steps"].get<int64_t>(),
                                                          b["tokens"].get<int64_t>())
                                            : std::string());
    }
    md += rank_rows(by_budget[k], P);
    for (auto& r : by_budget[k]) results.push_back(std::move(r));
  }
  if (n_budgets > 1) {
    const Json summary = budget_rankings(results);
    md += "\n| budgets | Kendall τ-b | methods |\n|---|---:|---:|\n";
    for (const auto& t : summary["kendall_tau"])
      md += fmt::format("| {} vs {} | {} | {} |\n", t["a"].get<std::string>(), t["b"].get<std::string>(),
                        t["tau"].is_null() ? "-" : fmt::format("{:.3f}", t["tau"].get<double>()),
                        t["methods"].get<int64_t>());
    if (per_budget) *per_budget = summary;
  }
  return results;
}

namespace {
std::string rank_rows(Json& results, const TrainPreset& P) {
  // Ranking by validation loss and the paired difference against the preset's baseline.
  const char* key = "val_bpb";
  if (!results.empty() && results[0].contains("val_bits_per_token")) key = "val_bits_per_token";
  const std::string delta_key = "delta_vs_" + P.baseline;
  double base = NAN;
  for (const auto& r : results)
    if (r["method"] == P.baseline && r["status"] == "ok") base = r[key].get<double>();
  std::vector<size_t> order;
  for (size_t i = 0; i < results.size(); ++i)
    if (results[i]["status"] == "ok") order.push_back(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return results[a][key].get<double>() < results[b][key].get<double>(); });
  for (size_t k = 0; k < order.size(); ++k) {
    Json& r = results[order[k]];
    r["rank"] = int64_t(k + 1);
    r[delta_key] = std::isnan(base) ? Json() : Json(r[key].get<double>() - base);
  }
  std::string md = fmt::format("| rank | method | val {} | FLOPs/token | calibration | params | tokens | tok/s | Δ vs {} |\n",
                   key == std::string("val_bpb") ? "bpb" : "bits/token", P.baseline);
  md += "|---:|---|---:|---:|---|---:|---:|---:|---:|\n";
  for (size_t i : order) {
    const Json& r = results[i];
    const Json& c = r["calibration"];
    const int64_t cd = c["d_model"].get<int64_t>(), cm = c.value("mlp_hidden", 4 * cd);
    md += fmt::format("| {} | {} | {:.4f} | {:.4g} | L={} d={}{} ({:+.2f}%{}) | {} | {} | {:.0f} | {} |\n",
                      r["rank"].get<int64_t>(), r["method"].get<std::string>(), r[key].get<double>(),
                      r["train_flops_per_token_nanochat"].get<double>(), c["n_layer"].get<int64_t>(), cd,
                      cm == 4 * cd ? std::string() : fmt::format(" mlp={}", cm), 100 * c["residual"].get<double>(),
                      c["within_2pct"].get<bool>() ? "" : ", outside ±2%", r["params"]["total"].get<int64_t>(),
                      r["tokens"].get<int64_t>(), r["tokens_per_s"].get<double>(),
                      r[delta_key].is_null() ? "-" : fmt::format("{:+.4f}", r[delta_key].get<double>()));
  }
  // Capability probes: held-out accuracy on the answer tokens (greedy argmax), chance in the header.
  std::vector<std::pair<std::string, double>> probe_cols;
  for (size_t i : order) {
    const Json probes = results[i].value("probes", Json::object());
    for (const auto& [name, v] : probes.items())
      if (std::none_of(probe_cols.begin(), probe_cols.end(), [&](const auto& c) { return c.first == name; }))
        probe_cols.emplace_back(name, v.value("chance", 0.0));
  }
  if (!probe_cols.empty()) {
    md += "\n| method |";
    std::string rule = "|---|";
    for (const auto& [name, chance] : probe_cols) {
      md += fmt::format(" {} (chance {:.3f}) |", name, chance);
      rule += "---:|";
    }
    md += "\n" + rule + "\n";
    for (size_t i : order) {
      const Json& r = results[i];
      md += "| " + r["method"].get<std::string>() + " |";
      const Json pr = r.value("probes", Json::object());
      for (const auto& c : probe_cols)
        md += pr.contains(c.first) ? fmt::format(" {:.3f} |", pr[c.first]["accuracy"].get<double>()) : " - |";
      md += "\n";
    }
  }
  for (const auto& r : results)
    if (r["status"] != "ok") md += fmt::format("\n{}: error: {}\n", r["method"].get<std::string>(), r["message"].get<std::string>());
  return md;
}
}  // namespace

}  // namespace mixbench
