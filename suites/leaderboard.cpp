#include "suites/leaderboard.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <tuple>

#include "harness/errors.h"
#include "harness/io.h"
#include "harness/registry.h"
#include "suites/distributed.h"
#include "suites/stats.h"
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
  // The FLOPs/token of a shape, or NaN for a shape the method refuses.
  auto flops_of = [&](int64_t L, int64_t D, int64_t M, std::string& shape) {
    shape = fmt::format("n_layer={},d_model={}", L, D);
    if (M != 0) shape += fmt::format(",mlp_hidden={}", M);
    Config c;
    try {
      c = ms.config.parse(cfg_text(shape, method));
    } catch (const InputError&) {
      return std::nan("");  // a shape this method cannot take
    }
    return account_model(ms, c, q).train_flops_nanochat;
  };
  // Candidates ordered: within ±2% first; among those the nearest shape, then the smallest residual;
  // outside ±2% the smallest residual. Returns the FLOPs/token, or NaN for a shape the method refuses.
  auto consider = [&](int64_t L, int64_t D, int64_t M) {
    std::string shape;
    const double f = flops_of(L, D, M, shape);
    if (std::isnan(f)) return f;
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
  // cost 6 FLOPs each per token, so the FLOPs are linear in M. A plan that applies its blocks
  // several times bills each application: when no shape lands within ±2% with that slope, the grid
  // is searched again with the slope read from one more width.
  auto search = [&](bool measured_slope) {
    for (int64_t L = 1; L <= 2 * ad.n_layer; ++L)
      for (int64_t D = ad.head_dim; D <= 2 * ad.d_model; D += ad.head_dim) {
        const double f4 = consider(L, D, 0);
        if (std::isnan(f4)) continue;
        double slope = 12.0 * double(L) * double(D);
        if (measured_slope) {
          std::string probe;
          slope = (flops_of(L, D, 4 * D + ad.head_dim, probe) - f4) / double(ad.head_dim);
          if (!(slope > 0)) continue;
        }
        const double m_exact = 4.0 * double(D) + (F - f4) / slope;
        const int64_t lo = int64_t(std::floor(m_exact / double(ad.head_dim))) * ad.head_dim;
        for (int64_t M : {lo, lo + ad.head_dim})
          if (M >= 2 * D && M <= 6 * D && M != 4 * D) consider(L, D, M);
      }
  };
  search(false);
  if (have && !best.within) search(true);
  if (!have) throw InputError(fmt::format("no shape of the calibration grid is valid for method '{}'", method));
  return best;
}

namespace {

// The methods a leaderboard ranks: the given list, the preset's lineup, or every registered method.
std::vector<std::string> lineup(const LeaderboardOptions& opt, const TrainPreset& P) {
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
  return methods;
}

int64_t seed_count(const LeaderboardOptions& opt, const TrainPreset& P) {
  if (opt.seeds < 0) throw UsageError("--seeds must be >= 1");
  return opt.seeds > 0 ? opt.seeds : P.seeds;
}

// The config fields that decide the numbers of a (method, seed) cell.
const char* const kCellFields[] = {"preset", "config",  "steps",  "batch",  "micro_batch", "data",
                                   "data_hash", "data_order", "device", "probes", "budget", "budgets"};

Json budget_labels(const LeaderboardOptions& opt) {
  Json labels = Json::array();
  for (const auto& b : opt.budgets) labels.push_back(b.str());
  return labels;
}

std::string metric_key(const std::vector<Json>& runs) {
  for (const auto& r : runs)
    if (r.contains("val_bits_per_token")) return "val_bits_per_token";
  return "val_bpb";
}

Json interval_json(const std::optional<Interval>& c) { return c ? Json::array({c->lo, c->hi}) : Json(); }

std::string interval_md(const Json& c, const char* fmt_one) {
  if (c.is_null()) return "-";
  return "[" + fmt::format(fmt::runtime(fmt_one), c[0].get<double>()) + ", " +
         fmt::format(fmt::runtime(fmt_one), c[1].get<double>()) + "]";
}

// Mean over the seeds of a numeric field every run has; null otherwise.
Json mean_of(const std::vector<Json>& runs, const char* field) {
  std::vector<double> v;
  for (const auto& r : runs)
    if (r.contains(field) && r[field].is_number()) v.push_back(r[field].get<double>());
  return v.size() == runs.size() && !v.empty() ? Json(mean(v)) : Json();
}

}  // namespace

Json leaderboard_config(const LeaderboardOptions& opt) {
  const TrainPreset P = train_preset(opt.preset);
  const std::string data = opt.data.empty() ? P.data : opt.data;
  const std::vector<std::string> methods = lineup(opt, P);
  return {{"preset", opt.preset},
          {"methods", methods.size()},
          {"method_names", methods},
          {"steps", opt.steps},
          {"batch", opt.batch},
          {"micro_batch", opt.micro_batch},
          {"data", data},
          {"data_hash", data == "synthetic" ? std::string("synthetic") : load_corpus(data, 0).hash},
          {"data_order", data_order(data)},
          {"budget", opt.budget},
          {"budgets", budget_labels(opt)},
          {"config", opt.config},
          {"anchor", P.anchor},
          {"baseline", P.baseline},
          {"device", opt.device},
          {"probes", opt.probe_sequences},
          {"seed", opt.seed},
          {"seeds", seed_count(opt, P)}};
}

void check_leaderboard_resume(const Json& report, const Json& config) {
  if (!report.is_object() || report.value("kind", std::string()) != "leaderboard" || !report.contains("config") ||
      !report["config"].is_object() || !report.contains("results") || !report["results"].is_array())
    throw InputError("not a leaderboard report");
  const Json& theirs = report["config"];
  for (const char* f : kCellFields)
    if (!theirs.contains(f) || theirs[f] != config.at(f))
      throw InputError(fmt::format("the report was written with {} = {}, this run has {} = {}", f,
                                   theirs.contains(f) ? theirs[f].dump() : std::string("(none)"), f, config.at(f).dump()));
}

namespace {
// A method's family control (MethodSpec::control, e.g. the residual streams' residual_standard):
// each method that names one is also compared with it, paired by seed, apart from the overall
// difference to the baseline.
std::string control_of(const std::string& method) {
  return Registry::get().has_method(method) ? Registry::get().method(method).control : std::string();
}
}  // namespace

Json leaderboard_rows(const std::vector<std::string>& methods, const std::vector<Json>& runs, const std::string& baseline,
                      std::string& md) {
  const std::string key = metric_key(runs);
  const std::string delta_key = "delta_vs_" + baseline;
  // Per method: its runs in seed order.
  std::vector<std::vector<Json>> by_method(methods.size());
  for (const auto& r : runs) {
    const auto it = std::find(methods.begin(), methods.end(), r.at("method").get<std::string>());
    if (it != methods.end()) by_method[size_t(it - methods.begin())].push_back(r);
  }
  for (auto& v : by_method)
    std::stable_sort(v.begin(), v.end(), [](const Json& a, const Json& b) { return a["seed"].get<uint64_t>() < b["seed"].get<uint64_t>(); });
  auto seed_values = [&](const std::vector<Json>& v) {
    std::map<uint64_t, double> m;
    for (const auto& r : v)
      if (r["status"] == "ok") m[r["seed"].get<uint64_t>()] = r[key].get<double>();
    return m;
  };
  std::map<uint64_t, double> base;
  std::map<std::string, std::map<uint64_t, double>> controls;  // family control -> its values by seed
  for (size_t i = 0; i < methods.size(); ++i)
    if (methods[i] == baseline) base = seed_values(by_method[i]);
  for (size_t i = 0; i < methods.size(); ++i) {
    const std::string c = control_of(methods[i]);
    if (c.empty()) continue;
    const auto it = std::find(methods.begin(), methods.end(), c);
    if (it != methods.end()) controls[c] = seed_values(by_method[size_t(it - methods.begin())]);
  }
  // The paired difference to `ref` over the seeds both have (null without one): mean, 95% interval.
  auto paired = [&](const std::vector<Json>& v, const std::map<uint64_t, double>& ref) -> std::pair<Json, Json> {
    std::vector<double> a, b;
    for (const auto& [s, val] : seed_values(v))
      if (ref.count(s)) {
        a.push_back(val);
        b.push_back(ref.at(s));
      }
    if (a.empty()) return {Json(), Json()};
    const PairedDifference d = paired_difference(a, b);
    return {d.mean, interval_json(d.ci95)};
  };
  Json results = Json::array();
  std::vector<double> means;
  std::vector<std::optional<Interval>> cis;
  std::vector<size_t> ok_rows;
  for (size_t i = 0; i < methods.size(); ++i) {
    const std::vector<Json>& v = by_method[i];
    if (v.empty()) continue;
    Json runs_json = Json::array(), seeds = Json::array();
    for (const auto& r : v) {
      runs_json.push_back(r);
      seeds.push_back(r["seed"]);
    }
    const auto failed = std::find_if(v.begin(), v.end(), [](const Json& r) { return r["status"] != "ok"; });
    Json row;
    if (failed != v.end()) {
      row = {{"status", "error"}, {"method", methods[i]},
             {"message", fmt::format("seed {}: {}", (*failed)["seed"].get<uint64_t>(), (*failed).value("message", std::string("failed")))}};
      if (v[0].contains("calibration")) row["calibration"] = v[0]["calibration"];
    } else {
      row = v[0];
      row.erase("seed");
      std::vector<double> x;
      for (const auto& r : v) x.push_back(r[key].get<double>());
      const std::optional<Interval> ci = ci95(x);
      row[key] = mean(x);
      row[key + "_seeds"] = x;
      row[key + "_sd"] = x.size() > 1 ? Json(sample_sd(x)) : Json();
      row[key + "_ci95"] = interval_json(ci);
      for (const char* f : {"tokens_per_s", "seconds"}) row[f] = mean_of(v, f);
      row.erase("mfu");
      if (Json m = mean_of(v, "mfu"); !m.is_null()) row["mfu"] = m;
      // probe accuracies: the mean over the seeds
      for (auto& [name, p] : row["probes"].items())
        for (const char* f : {"accuracy", "exact"}) {
          std::vector<Json> per;
          for (const auto& r : v)
            if (r.contains("probes") && r["probes"].contains(name)) per.push_back(r["probes"][name]);
          if (per.size() == v.size() && !mean_of(per, f).is_null()) p[f] = mean_of(per, f);
        }
      // the paired difference to the baseline over the seeds both have
      std::tie(row[delta_key], row[delta_key + "_ci95"]) = paired(v, base);
      // a method with a family control: also against it, when the control is in the lineup
      if (const std::string c = control_of(methods[i]); controls.count(c) && !controls.at(c).empty()) {
        row["residual_control"] = c;
        std::tie(row["residual_delta"], row["residual_delta_ci95"]) = paired(v, controls.at(c));
      }
      means.push_back(row[key].get<double>());
      cis.push_back(ci);
      ok_rows.push_back(results.size());
    }
    row["seeds"] = seeds;
    row["runs"] = runs_json;
    results.push_back(row);
  }
  // Ranks: shared where the intervals overlap (a method with a single seed among methods with more
  // shares every rank: its interval is unknown), by the means when no method has an interval.
  const std::vector<RankRange> ranks = shared_ranks(means, cis);
  for (size_t k = 0; k < ok_rows.size(); ++k) results[ok_rows[k]]["rank"] = ranks[k].str();
  md = leaderboard_markdown(results, baseline);
  return results;
}

LeaderboardTables leaderboard_tables(const Json& results, const std::string& baseline) {
  std::vector<Json> rows;
  for (const auto& r : results)
    if (r.value("status", std::string()) == "ok") rows.push_back(r);
  const std::string key = metric_key(rows);
  const std::string delta_key = "delta_vs_" + baseline;
  // the row's value (either metric; +inf when it has none)
  auto value_of = [&](const Json& r) {
    for (const std::string& k : {key, std::string("val_bpb"), std::string("val_bits_per_token")})
      if (r.contains(k) && r[k].is_number()) return r[k].get<double>();
    return double(INFINITY);
  };
  std::stable_sort(rows.begin(), rows.end(), [&](const Json& a, const Json& b) { return value_of(a) < value_of(b); });
  auto num = [](const Json& j, const std::string& k, const char* f) {
    return j.contains(k) && j[k].is_number() ? fmt::format(fmt::runtime(f), j[k].get<double>()) : std::string("-");
  };
  auto has_ci = [&](const Json& r) { return r.contains(key + "_ci95") && !r[key + "_ci95"].is_null(); };
  const size_t n_ci = size_t(std::count_if(rows.begin(), rows.end(), has_ci));
  const bool intervals = n_ci > 0;
  LeaderboardTables t;
  size_t n_seeds = 0;
  for (const Json& r : rows) n_seeds = std::max(n_seeds, r.value(key + "_seeds", Json::array()).size());
  t.note = intervals ? fmt::format("{} seeds per method: mean ± sample sd, 95% t-intervals, Δ paired by seed; ranks shared "
                                   "where the intervals overlap{}",
                                   n_seeds,
                                   n_ci < rows.size() ? fmt::format("; {} method(s) with a single seed have no interval and "
                                                                    "share every rank",
                                                                    rows.size() - n_ci)
                                                      : std::string())
                     : std::string("single seed: no intervals, ranks by the value");
  const bool bpb = key == "val_bpb";
  const bool mfu = std::any_of(rows.begin(), rows.end(), [](const Json& r) { return r.contains("mfu"); });
  t.ranking.header = {"rank", "method", fmt::format("val {} (mean ± sd)", bpb ? "bpb" : "bits/token"), "95% CI",
                      "Δ vs " + baseline, "Δ 95% CI", "FLOPs/token", "calibration", "params", "tokens", "tok/s"};
  t.ranking.right = {true, false, true, true, true, true, true, false, true, true, true};
  // residual-stream methods' difference to their family's control, beside the baseline's
  const auto with_control =
      std::find_if(rows.begin(), rows.end(), [](const Json& r) { return r.contains("residual_delta"); });
  if (with_control != rows.end()) {
    t.ranking.header.insert(t.ranking.header.begin() + 6,
                            {"Δ vs " + (*with_control)["residual_control"].get<std::string>(), "Δ 95% CI"});
    t.ranking.right.insert(t.ranking.right.begin() + 6, {true, true});
  }
  if (mfu) {
    t.ranking.header.push_back("MFU");
    t.ranking.right.push_back(true);
  }
  for (const Json& r : rows) {
    // a tie: a shared rank range, or (single runs) the same value as another's
    const std::string rank = r.contains("rank") ? (r["rank"].is_string() ? r["rank"].get<std::string>() : r["rank"].dump()) : "-";
    bool tie = rank.find("–") != std::string::npos;
    if (!intervals)
      for (const Json& o : rows) tie = tie || (&o != &r && value_of(o) == value_of(r) && std::isfinite(value_of(r)));
    t.ranking.tie.push_back(tie);
    std::string calibration = "-";
    if (const Json c = r.value("calibration", Json::object()); c.contains("n_layer") && c.contains("d_model")) {
      const int64_t cd = c["d_model"].get<int64_t>(), cm = c.value("mlp_hidden", 4 * cd);
      calibration = fmt::format("L={} d={}{} ({:+.2f}%{})", c["n_layer"].get<int64_t>(), cd,
                                cm == 4 * cd ? std::string() : fmt::format(" mlp={}", cm), 100 * c.value("residual", 0.0),
                                c.value("within_2pct", true) ? "" : ", outside ±2%");
    }
    const Json sd = r.value(key + "_sd", Json());
    // The baseline's difference to itself (and a control's) is no measurement: a dash, not
    // +0.0000 [+0.0000, +0.0000].
    const std::string method = r.value("method", std::string("?"));
    const bool anchor = method == baseline, own_control = r.value("residual_control", std::string()) == method;
    std::vector<std::string> cells = {
        rank + (tie ? " =" : ""),
        r.value("method", std::string("?")),
        std::isfinite(value_of(r)) ? fmt::format("{:.4f}", value_of(r)) +
                                         (sd.is_number() ? fmt::format(" ± {:.4f}", sd.get<double>()) : std::string())
                                   : std::string("-"),
        interval_md(r.value(key + "_ci95", Json()), "{:.4f}"),
        anchor ? std::string("—") : num(r, delta_key, "{:+.4f}"),
        anchor ? std::string("—") : interval_md(r.value(delta_key + "_ci95", Json()), "{:+.4f}"),
        num(r, "train_flops_per_token_nanochat", "{:.4g}"),
        calibration,
        num(r.value("params", Json::object()), "total", "{:.0f}"),
        num(r, "tokens", "{:.0f}"),
        num(r, "tokens_per_s", "{:.0f}")};
    if (with_control != rows.end())
      cells.insert(cells.begin() + 6, {own_control ? std::string("—") : num(r, "residual_delta", "{:+.4f}"),
                                       own_control ? std::string("—")
                                                   : interval_md(r.value("residual_delta_ci95", Json()), "{:+.4f}")});
    if (mfu) cells.push_back(r.contains("mfu") && r["mfu"].is_number() ? fmt::format("{:.1f}%", 100 * r["mfu"].get<double>())
                                                                     : std::string("-"));
    t.ranking.rows.push_back(cells);
  }
  if (std::count(t.ranking.tie.begin(), t.ranking.tie.end(), true) > 0)
    t.tie_note = std::string("= tied: ") + (intervals ? "its 95% interval overlaps another's" : "the same value as another");
  // Capability probes: held-out accuracy on the answer tokens (greedy argmax), chance in the header.
  std::vector<std::pair<std::string, double>> probe_cols;
  for (const Json& r : rows) {
    const Json probes = r.value("probes", Json::object());
    for (const auto& [name, v] : probes.items())
      if (std::none_of(probe_cols.begin(), probe_cols.end(), [&](const auto& c) { return c.first == name; }))
        probe_cols.emplace_back(name, v.value("chance", 0.0));
  }
  if (!probe_cols.empty()) {
    t.probes.header = {"method"};
    t.probes.right = {false};
    for (const auto& [name, chance] : probe_cols) {
      t.probes.header.push_back(fmt::format("{} (chance {:.3f})", name, chance));
      t.probes.right.push_back(true);
    }
    for (const Json& r : rows) {
      std::vector<std::string> cells = {r.value("method", std::string("?"))};
      const Json pr = r.value("probes", Json::object());
      for (const auto& c : probe_cols) cells.push_back(pr.contains(c.first) ? num(pr[c.first], "accuracy", "{:.3f}") : "-");
      t.probes.rows.push_back(cells);
      t.probes.tie.push_back(false);
    }
  }
  for (const auto& r : results)
    if (r.value("status", std::string()) != "ok")
      t.errors.push_back(fmt::format("{}: error: {}", r.value("method", std::string("?")), r.value("message", std::string())));
  return t;
}

std::string markdown_table(const TextTable& t) {
  std::string md = "|", rule = "|";
  for (size_t i = 0; i < t.header.size(); ++i) {
    md += " " + t.header[i] + " |";
    rule += t.right[i] ? "---:|" : "---|";
  }
  md += "\n" + rule + "\n";
  for (const auto& row : t.rows) {
    md += "|";
    for (const auto& c : row) md += " " + c + " |";
    md += "\n";
  }
  return md;
}

std::string leaderboard_markdown(const Json& results, const std::string& baseline) {
  const LeaderboardTables t = leaderboard_tables(results, baseline);
  std::string md = t.note + "\n\n" + markdown_table(t.ranking);
  if (!t.tie_note.empty()) md += "\n" + t.tie_note + "\n";
  if (!t.probes.header.empty()) md += "\n" + markdown_table(t.probes);
  for (const auto& e : t.errors) md += "\n" + e + "\n";
  return md;
}

TrainOptions leaderboard_cell_options(const LeaderboardOptions& opt, const std::string& m, uint64_t seed, const Calibration& cal) {
  TrainOptions to;
  to.method = m;
  to.preset = opt.preset;
  to.config = cal.config + (opt.config.empty() ? "" : "," + opt.config);
  to.steps = opt.steps;
  to.batch = opt.batch;
  to.micro_batch = opt.micro_batch;
  to.seed = seed;
  to.data = opt.data;
  to.progress = opt.progress;
  to.probe_sequences = opt.probe_sequences;
  to.device = opt.device;
  to.dtype = opt.dtype;
  to.graph = opt.graph;
  to.data_parallel = opt.data_parallel;
  to.budget = opt.budgets.size() == 1 ? opt.budgets[0].str() : opt.budget;
  to.anchor_config = opt.config;
  // the cell's own checkpoint folder: resumed when it holds this run's checkpoint (run_train
  // refuses one of a different run, naming it), removed once the cell is done
  if (!opt.cell_checkpoints.empty()) {
    to.out = (std::filesystem::path(opt.cell_checkpoints) / fmt::format("{}.s{}", m, seed)).string();
    to.resume = std::filesystem::exists(std::filesystem::path(to.out) / "checkpoint.safetensors");
  }
  return to;
}

Json run_leaderboard(const LeaderboardOptions& opt, std::string& md, Json* summary_out) {
  const TrainPreset P = train_preset(opt.preset);
  const std::vector<std::string> methods = lineup(opt, P);
  const int64_t n_seeds = seed_count(opt, P);
  // With several budgets (--budgets) each cell trains the method to every budget in one pass
  // (run_budgets) and each budget is ranked on its own, with Kendall's tau between the rankings.
  const size_t n_budgets = std::max<size_t>(1, opt.budgets.size());
  if (!opt.cell_checkpoints.empty() && n_budgets > 1)
    throw UsageError("--cell-checkpoints takes one budget: a run to several budgets (--budgets) branches in memory");
  // Cells finished by earlier runs with the same options (the report being resumed, then the --from
  // reports in order): per budget (a row of a report with several budgets names its budget), kept
  // where every budget has the cell. Failed cells are remembered apart (shown with no_train).
  using Cell = std::pair<std::string, uint64_t>;
  std::vector<std::map<Cell, Json>> kept_at(n_budgets), failed_at(n_budgets);
  std::vector<std::map<Cell, std::string>> kept_source(n_budgets);
  std::vector<std::pair<std::string, const Json*>> sources;
  if (!opt.resume.is_null()) sources.emplace_back(opt.out.empty() ? std::string("the report to resume") : opt.out, &opt.resume);
  for (const auto& [name, report] : opt.from) sources.emplace_back(name, &report);
  const Json config = sources.empty() ? Json() : leaderboard_config(opt);
  for (const auto& [name, report] : sources) {
    try {
      check_leaderboard_resume(*report, config);
    } catch (const InputError& e) {
      throw InputError(fmt::format("'{}': {}", name, e.what()));
    }
    for (const auto& row : (*report)["results"]) {
      size_t k = 0;
      if (n_budgets > 1) {
        const std::string label = row.contains("budget") && row["budget"].is_object()
                                      ? row["budget"].value("budget", std::string())
                                      : std::string();
        while (k < n_budgets && opt.budgets[k].str() != label) ++k;
        if (k == n_budgets) continue;
      }
      for (const auto& run : row.value("runs", Json::array())) {
        if (!run.is_object() || !run.contains("seed") || !run["seed"].is_number_unsigned() || !run.contains("method") ||
            !run["method"].is_string())
          continue;
        const Cell cell{run["method"].get<std::string>(), run["seed"].get<uint64_t>()};
        if (run.value("status", std::string()) != "ok") {
          failed_at[k].emplace(cell, run);
          continue;
        }
        const auto it = kept_at[k].find(cell);
        if (it == kept_at[k].end()) {
          kept_at[k][cell] = run;
          kept_source[k][cell] = name;
          continue;
        }
        // the same cell twice: kept from the first where the values the ranking reads agree
        for (const char* f : {"val_bpb", "val_bits_per_token"})
          if (run.value(f, Json()) != it->second.value(f, Json()))
            throw InputError(fmt::format("'{}' and '{}' both hold {} seed {}{} with different {} ({} and {}); keep one of them",
                                         kept_source[k][cell], name, cell.first, cell.second,
                                         n_budgets > 1 ? " at budget " + opt.budgets[k].str() : std::string(), f,
                                         it->second.value(f, Json()).dump(), run.value(f, Json()).dump()));
      }
    }
  }
  Json seed_values = Json::array();
  for (int64_t k = 0; k < n_seeds; ++k) seed_values.push_back(opt.seed + uint64_t(k));
  const int64_t cells = int64_t(methods.size()) * n_seeds;
  std::vector<std::vector<Json>> runs(n_budgets);
  int64_t trained = 0;
  Json missing = Json::array();  // [method, seed] cells neither trained nor kept
  Json results, summary;
  auto update = [&] {
    if (n_budgets == 1) {
      results = leaderboard_rows(methods, runs[0], P.baseline, md);
    } else {
      results = Json::array();
      md.clear();
      for (size_t k = 0; k < n_budgets; ++k) {
        std::string part;
        Json rows = leaderboard_rows(methods, runs[k], P.baseline, part);
        const Json b = runs[k].empty() ? Json() : runs[k][0].value("budget", Json());
        md += fmt::format("{}## budget {}{}\n\n", k ? "\n" : "", opt.budgets[k].str(),
                          b.is_object() && b.contains("steps")
                              ? fmt::format(" ({} steps, {} tokens)", b["steps"].get<int64_t>(), b["tokens"].get<int64_t>())
                              : std::string());
        md += part;
        for (auto& r : rows) {
          r["budget"] = runs[k].empty() ? Json{{"budget", opt.budgets[k].str()}} : runs[k][0].value("budget", Json());
          results.push_back(std::move(r));
        }
      }
    }
    if (opt.no_train && !missing.empty()) {
      std::string names;
      for (const auto& c : missing) names += fmt::format("{}{} seed {}", names.empty() ? "" : ", ", c[0].get<std::string>(), c[1].get<uint64_t>());
      md += fmt::format("\n{} of {} cells missing (in no earlier report; not trained): {}\n", missing.size(), cells, names);
    }
    summary = {{"seeds", n_seeds}, {"seed_values", seed_values}, {"cells", cells}, {"cells_done", int64_t(runs[0].size())},
               {"cells_trained", trained}, {"complete", int64_t(runs[0].size()) == cells}, {"single_seed", n_seeds == 1},
               {"baseline", P.baseline}, {"missing", missing}};
    if (n_budgets > 1) {
      const Json per_budget = budget_rankings(results);
      summary["budgets"] = per_budget["budgets"];
      summary["kendall_tau"] = per_budget["kendall_tau"];
      md += "\n| budgets | Kendall τ-b | methods |\n|---|---:|---:|\n";
      for (const auto& t : per_budget["kendall_tau"])
        md += fmt::format("| {} vs {} | {} | {} |\n", t["a"].get<std::string>(), t["b"].get<std::string>(),
                          t["tau"].is_null() ? "-" : fmt::format("{:.3f}", t["tau"].get<double>()), t["methods"].get<int64_t>());
    }
  };
  std::map<std::string, Calibration> cals;
  for (const auto& m : methods) cals[m] = calibrate(m, opt.preset, opt.config);
  // Seed by seed, so that an interrupted run has every method at its first seeds; past
  // --stop-after only the kept cells are taken.
  for (int64_t k = 0; k < n_seeds; ++k)
    for (const auto& m : methods) {
      const uint64_t seed = opt.seed + uint64_t(k);
      const Calibration& cal = cals.at(m);
      std::vector<Json> rows(n_budgets);
      Json& row = rows[0];
      bool reuse = true, failed_before = true;
      for (size_t k = 0; k < n_budgets; ++k) {
        reuse = reuse && kept_at[k].count({m, seed});
        failed_before = failed_before && (kept_at[k].count({m, seed}) || failed_at[k].count({m, seed}));
      }
      // with no_train a cell an earlier report holds failed is shown failed, as that run had it
      if (!reuse && opt.no_train && failed_before) {
        for (size_t k = 0; k < n_budgets; ++k) rows[k] = kept_at[k].count({m, seed}) ? kept_at[k].at({m, seed}) : failed_at[k].at({m, seed});
        reuse = true;
      }
      if (!reuse && (opt.no_train || (opt.stop_after > 0 && trained >= opt.stop_after))) {
        missing.push_back({m, seed});
        continue;
      }
      if (reuse) {
        if (rows[0].is_null())
          for (size_t k = 0; k < n_budgets; ++k) rows[k] = kept_at[k].at({m, seed});
      } else {
        const TrainOptions to = leaderboard_cell_options(opt, m, seed, cal);
        if (opt.progress && to.resume)
          std::cerr << fmt::format("leaderboard cell {} seed {}: resuming from {}\n", m, seed, to.out);
        auto failed = [&](const std::string& message) {
          for (size_t k = 0; k < n_budgets; ++k) {
            rows[k] = {{"status", "error"}, {"method", m}, {"message", message}};
            if (n_budgets > 1) rows[k]["budget"] = {{"budget", opt.budgets[k].str()}};
          }
        };
        try {
          if (n_budgets > 1) {
            const std::vector<TrainResult> trs = run_budgets(to, opt.budgets);
            for (size_t k = 0; k < n_budgets; ++k) rows[k] = train_result_json(trs[k]);
          } else {
            row = train_result_json(run_train(to));
            if (!to.out.empty() && !remove_flat_dir(to.out))  // the cell is in the report now
              std::cerr << fmt::format("leaderboard cell {} seed {}: could not remove {}\n", m, seed, to.out);
          }
        } catch (const UsageError&) {
          throw;
        } catch (const PeerFailure&) {  // the ranks no longer agree on where they are
          throw;
        } catch (const c10::Error& e) {  // e.g. CUDA out of memory: the message, not LibTorch's backtrace
          failed(e.what_without_backtrace());
        } catch (const std::exception& e) {
          failed(e.what());
        }
        ++trained;
      }
      for (size_t k = 0; k < n_budgets; ++k) {
        rows[k]["seed"] = seed;
        rows[k]["calibration"] = {{"n_layer", cal.n_layer}, {"d_model", cal.d_model},
                                  {"mlp_hidden", cal.mlp_hidden ? cal.mlp_hidden : 4 * cal.d_model},
                                  {"flops_per_token", cal.flops}, {"anchor_flops_per_token", cal.anchor_flops},
                                  {"residual", cal.residual}, {"within_2pct", cal.within}};
        runs[k].push_back(rows[k]);
      }
      if (opt.progress) {
        const Json line = {{"leaderboard_cell", int64_t(runs[0].size())}, {"cells", cells}, {"method", m}, {"seed", seed},
                           {"state", reuse ? "kept" : "trained"}};
        if (opt.progress == 1) std::cout << line.dump() << std::endl;
        else
          std::cout << fmt::format("leaderboard cell {}/{}: {} seed {} {}\n", runs[0].size(), cells, m, seed,
                                   reuse ? "kept from an earlier report" : "trained")
                    << std::flush;
      }
      update();
      if (opt.on_cell) opt.on_cell(results, md, summary);
    }
  update();  // the summary also names the cells left out at the end
  if (summary_out) *summary_out = summary;
  return results;
}

}  // namespace mixbench
