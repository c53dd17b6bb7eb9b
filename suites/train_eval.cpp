#include "suites/train_eval.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <random>

#include "harness/errors.h"

namespace mixbench {

using Json = nlohmann::json;

// ------------------------------------------------------------------ probes
namespace {
uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct Rng {
  std::mt19937_64 g;
  Rng(uint64_t seed, uint64_t salt, int64_t index) : g(mix64(mix64(seed ^ salt) ^ uint64_t(index))) {}
  int64_t uni(int64_t lo, int64_t hi) { return lo + int64_t(g() % uint64_t(hi - lo + 1)); }
};

void push(ProbeSeq& s, const std::string& text) {
  for (unsigned char c : text) s.tokens.push_back(int64_t(c));
}
void push_answer(ProbeSeq& s, int64_t tok) {
  s.answer_pos.push_back(int64_t(s.tokens.size()));
  s.tokens.push_back(tok);
}

const char* kFillerWords[] = {"the", "a", "river", "stone", "light", "blue", "runs", "over", "under", "small",
                              "green", "house", "quiet", "fast", "and", "of", "tree", "sky", "old", "new",
                              "cold", "warm", "bird", "sings", "wind", "moves", "near", "far", "red", "road",
                              "sand", "glass"};
const char* kNoise = " the grass is green. the sky is blue. the sun is yellow. here we go. there and back again.";

// Permutations of {0..n−1} in std::next_permutation order; element i of the result is rank i.
std::vector<std::vector<int>> permutations(int n) {
  std::vector<int> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  std::vector<std::vector<int>> all;
  do all.push_back(p);
  while (std::next_permutation(p.begin(), p.end()));
  return all;
}
}  // namespace

ProbeSeq probe_mqar(uint64_t seed, int64_t index, int64_t n_pairs) {
  if (n_pairs < 1 || n_pairs > 26) throw InputError(fmt::format("mqar takes 1..26 key-value pairs, not {}", n_pairs));
  Rng r(seed, 0x4D514152ull, index);
  std::vector<int64_t> keys(26);
  std::iota(keys.begin(), keys.end(), int64_t('A'));
  std::shuffle(keys.begin(), keys.end(), r.g);
  keys.resize(size_t(n_pairs));
  std::vector<int64_t> vals;
  for (int64_t i = 0; i < n_pairs; ++i) vals.push_back(int64_t('a') + r.uni(0, 25));
  ProbeSeq s;
  push(s, "mqar:");
  for (int64_t i = 0; i < n_pairs; ++i) {
    s.tokens.push_back(keys[size_t(i)]);
    s.tokens.push_back(vals[size_t(i)]);
  }
  push(s, "?");
  std::vector<int64_t> order(static_cast<size_t>(n_pairs));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), r.g);
  for (int64_t i : order) {
    s.tokens.push_back(keys[size_t(i)]);
    push_answer(s, vals[size_t(i)]);
  }
  push(s, "\n");
  return s;
}

ProbeSeq probe_niah(int variant, uint64_t seed, int64_t index, int64_t length) {
  if (variant < 1 || variant > 3) throw InputError(fmt::format("niah variant {} is not 1, 2 or 3", variant));
  if (length < 48) throw InputError(fmt::format("niah needs a length of at least 48 bytes, not {}", length));
  Rng r(seed, 0x4E494148ull + uint64_t(variant), index);
  std::string key;
  for (int i = 0; i < 3; ++i) key += char('a' + r.uni(0, 25));
  std::string value;
  if (variant == 3)
    for (int i = 0; i < 6; ++i) value += "0123456789abcdef"[r.uni(0, 15)];
  else
    for (int i = 0; i < 4; ++i) value += char('0' + r.uni(0, 9));
  const std::string needle = " key " + key + " is " + value + ".";
  const std::string query_head = " what is " + key + "? ";
  const int64_t budget = length - int64_t(needle.size() + query_head.size() + value.size() + 1);
  // Filler made of whole sentences (each starting with a space and ending with '.'), cut to size.
  std::vector<std::string> sentences;
  int64_t used = 0;
  const std::string noise = kNoise;
  size_t noise_at = size_t(r.uni(0, 4));
  while (used < budget) {
    std::string sent;
    if (variant == 1) {
      // RULER's repeated noise, sentence by sentence, from a random starting sentence
      size_t pos = 0;
      for (size_t k = 0; k < noise_at % 5; ++k) pos = noise.find('.', pos) + 1;
      const size_t end = noise.find('.', pos);
      sent = noise.substr(pos, end - pos + 1);
      ++noise_at;
    } else {
      for (int64_t w = 0, nw = r.uni(3, 8); w < nw; ++w) sent += std::string(" ") + kFillerWords[r.uni(0, 31)];
      sent += ".";
    }
    if (used + int64_t(sent.size()) > budget) sent = sent.substr(0, size_t(budget - used));
    used += int64_t(sent.size());
    sentences.push_back(sent);
  }
  const int64_t where = r.uni(0, int64_t(sentences.size()));
  ProbeSeq s;
  for (int64_t i = 0; i <= int64_t(sentences.size()); ++i) {
    if (i == where) push(s, needle);
    if (i < int64_t(sentences.size())) push(s, sentences[size_t(i)]);
  }
  push(s, query_head);
  for (unsigned char c : value) push_answer(s, int64_t(c));
  push(s, "\n");
  return s;
}

ProbeSeq probe_perm(int n, uint64_t seed, int64_t index, int64_t steps) {
  if (n != 3 && n != 5) throw InputError(fmt::format("permutation probes use S3 or S5, not S{}", n));
  if (steps < 1) throw InputError("a permutation probe needs at least one step");
  static const auto s3 = permutations(3), s5 = permutations(5);
  const auto& all = n == 3 ? s3 : s5;
  auto rank = [&](const std::vector<int>& p) {
    return int64_t(std::lower_bound(all.begin(), all.end(), p) - all.begin());  // lexicographic order
  };
  Rng r(seed, 0x5045524Dull + uint64_t(n), index);
  ProbeSeq s;
  push(s, fmt::format("s{}:", n));
  std::vector<int> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t g = r.uni(0, int64_t(all.size()) - 1);
    const auto& gp = all[size_t(g)];
    std::vector<int> q(static_cast<size_t>(n));
    for (int x = 0; x < n; ++x) q[size_t(x)] = p[size_t(gp[size_t(x)])];
    p = q;
    s.tokens.push_back(128 + g);
    push_answer(s, 128 + rank(p));
  }
  push(s, "\n");
  return s;
}

std::vector<ProbeSpec> probe_suite(int64_t T) {
  std::vector<ProbeSpec> v;
  const int64_t room = T - 1;  // the BOS
  // mqar: 5 + 2n + 1 + 2n + 1 bytes
  const int64_t pairs = std::min<int64_t>(16, (room - 7) / 4);
  if (pairs >= 2)
    v.push_back({"mqar", 1.0 / 26, [pairs](uint64_t s, int64_t i) { return probe_mqar(s, i, pairs); }});
  const int64_t niah_len = std::min<int64_t>(room, 256);
  if (niah_len >= 48)
    for (int var = 1; var <= 3; ++var)
      v.push_back({fmt::format("niah_single_{}", var), var == 3 ? 1.0 / 16 : 1.0 / 10,
                   [var, niah_len](uint64_t s, int64_t i) { return probe_niah(var, s, i, niah_len); }});
  // perm: 3 + 2k + 1 bytes
  const int64_t steps = std::min<int64_t>(24, (room - 4) / 2);
  if (steps >= 2) {
    v.push_back({"perm_s3", 1.0 / 6, [steps](uint64_t s, int64_t i) { return probe_perm(3, s, i, steps); }});
    v.push_back({"perm_s5", 1.0 / 120, [steps](uint64_t s, int64_t i) { return probe_perm(5, s, i, steps); }});
  }
  return v;
}

ProbeScore score_probes(const std::vector<ProbeSeq>& seqs, const LogitsFn& logits, int64_t bos, int64_t batch) {
  c10::NoGradGuard ng;
  ProbeScore sc;
  int64_t correct = 0, exact = 0;
  for (size_t b0 = 0; b0 < seqs.size(); b0 += size_t(batch)) {
    const size_t b1 = std::min(seqs.size(), b0 + size_t(batch));
    int64_t L = 0;
    for (size_t i = b0; i < b1; ++i) L = std::max<int64_t>(L, int64_t(seqs[i].tokens.size()) + 1);
    at::Tensor idx = at::full({int64_t(b1 - b0), L}, bos, at::TensorOptions().dtype(at::kLong));
    auto acc = idx.accessor<int64_t, 2>();
    for (size_t i = b0; i < b1; ++i)
      for (size_t t = 0; t < seqs[i].tokens.size(); ++t) acc[int64_t(i - b0)][int64_t(t) + 1] = seqs[i].tokens[t];
    at::Tensor pred = logits(idx).argmax(-1).to(at::kCPU).to(at::kLong).contiguous();
    auto pa = pred.accessor<int64_t, 2>();
    for (size_t i = b0; i < b1; ++i) {
      bool all = true;
      for (int64_t p : seqs[i].answer_pos) {
        // token p sits at column p+1 and is predicted by the logits of column p
        const bool ok = pa[int64_t(i - b0)][p] == seqs[i].tokens[size_t(p)];
        correct += ok;
        all = all && ok;
        ++sc.answers;
      }
      exact += all;
      ++sc.sequences;
    }
  }
  sc.accuracy = sc.answers ? double(correct) / double(sc.answers) : 0.0;
  sc.exact = sc.sequences ? double(exact) / double(sc.sequences) : 0.0;
  return sc;
}

uint64_t probe_eval_seed(uint64_t seed) { return mix64(seed ^ 0x484F4C444F5554ull); }

Json evaluate_probes(const LogitsFn& logits, int64_t T, uint64_t seed, int64_t n_per_probe, int64_t bos) {
  Json out = Json::object();
  const uint64_t es = probe_eval_seed(seed);
  for (const auto& spec : probe_suite(T)) {
    std::vector<ProbeSeq> seqs;
    for (int64_t i = 0; i < n_per_probe; ++i) seqs.push_back(spec.make(es, i));
    ProbeScore sc = score_probes(seqs, logits, bos);
    out[spec.name] = {{"accuracy", sc.accuracy}, {"exact", sc.exact}, {"chance", spec.chance},
                      {"sequences", sc.sequences}, {"answers", sc.answers}};
  }
  return out;
}

// ------------------------------------------------------------------ HTML page
namespace {
std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '&') o += "&amp;";
    else if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                         "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

struct Panel {
  double x0, y0, w, h;          // plot area in SVG units
  double xmin, xmax, ymin, ymax;
  double X(double x) const { return x0 + (xmax > xmin ? (x - xmin) / (xmax - xmin) : 0.5) * w; }
  double Y(double y) const { return y0 + h - (ymax > ymin ? (y - ymin) / (ymax - ymin) : 0.5) * h; }
};

void pad_range(double& lo, double& hi) {
  if (!(hi > lo)) {
    const double m = std::isfinite(lo) ? lo : 0.0;
    lo = m - 0.5;
    hi = m + 0.5;
    return;
  }
  const double d = 0.05 * (hi - lo);
  lo -= d;
  hi += d;
}

std::string axes(const Panel& p, const std::string& xlabel, const std::string& ylabel, const std::string& title) {
  std::string s = fmt::format(
      "<g class=\"axes\"><rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
      "stroke=\"#444\"/>\n",
      p.x0, p.y0, p.w, p.h);
  for (int k = 0; k <= 4; ++k) {
    const double fx = p.xmin + (p.xmax - p.xmin) * k / 4.0, fy = p.ymin + (p.ymax - p.ymin) * k / 4.0;
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"middle\">{:.3g}</text>\n",
                     p.X(fx), p.y0 + p.h + 14, fx);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"end\">{:.3g}</text>\n", p.x0 - 4,
                     p.Y(fy) + 3, fy);
    s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#eee\"/>\n", p.X(fx),
                     p.y0, p.y0 + p.h);
  }
  s += fmt::format("<text class=\"xlabel\" x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"middle\">{}</text>\n",
                   p.x0 + p.w / 2, p.y0 + p.h + 32, esc(xlabel));
  s += fmt::format(
      "<text class=\"ylabel\" x=\"{0:.1f}\" y=\"{1:.1f}\" font-size=\"12\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 {0:.1f} {1:.1f})\">{2}</text>\n",
      p.x0 - 44, p.y0 + p.h / 2, esc(ylabel));
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"13\" font-weight=\"bold\" text-anchor=\"middle\">{}</text>\n",
                   p.x0 + p.w / 2, p.y0 - 8, esc(title));
  return s + "</g>\n";
}
}  // namespace

std::string leaderboard_html(const Json& results, const std::string& title, const std::string& markdown) {
  struct Row {
    std::string method;
    std::vector<std::pair<double, double>> loss;  // (cumulative FLOPs, loss)
    double fpt = 0, bpb = NAN;
  };
  std::vector<Row> rows;
  std::string metric = "val bpb";
  for (const auto& r : results) {
    if (r.value("status", "") != "ok") continue;
    Row row;
    row.method = r.value("method", "?");
    row.fpt = r.value("train_flops_per_token_nanochat", 0.0);
    if (r.contains("val_bpb")) row.bpb = r["val_bpb"].get<double>();
    else if (r.contains("val_bits_per_token")) {
      row.bpb = r["val_bits_per_token"].get<double>();
      metric = "val bits/token";
    }
    const auto losses = r.value("loss_curve", std::vector<double>{});
    const int64_t steps = r.value("steps", int64_t(losses.size()));
    const double tokens_per_step = steps > 0 ? double(r.value("tokens", int64_t(0))) / double(steps) : 0.0;
    const size_t stride = std::max<size_t>(1, losses.size() / 400);
    for (size_t i = 0; i < losses.size(); i += stride)
      if (std::isfinite(losses[i])) row.loss.emplace_back(double(i + 1) * tokens_per_step * row.fpt, losses[i]);
    if (!losses.empty() && (losses.size() - 1) % stride != 0 && std::isfinite(losses.back()))
      row.loss.emplace_back(double(losses.size()) * tokens_per_step * row.fpt, losses.back());
    rows.push_back(std::move(row));
  }
  Panel a{80, 40, 440, 300, 0, 0, 0, 0}, b{660, 40, 440, 300, 0, 0, 0, 0};
  double lmin = INFINITY, lmax = -INFINITY, fmax = 0, bmin = INFINITY, bmax = -INFINITY, pmin = INFINITY, pmax = -INFINITY;
  for (const auto& r : rows) {
    for (const auto& [f, l] : r.loss) {
      fmax = std::max(fmax, f);
      lmin = std::min(lmin, l);
      lmax = std::max(lmax, l);
    }
    if (std::isfinite(r.bpb)) {
      bmin = std::min(bmin, r.bpb);
      bmax = std::max(bmax, r.bpb);
      pmin = std::min(pmin, r.fpt);
      pmax = std::max(pmax, r.fpt);
    }
  }
  a.xmin = 0;
  a.xmax = fmax > 0 ? fmax : 1;
  a.ymin = lmin;
  a.ymax = lmax;
  pad_range(a.ymin, a.ymax);
  b.xmin = pmin;
  b.xmax = pmax;
  pad_range(b.xmin, b.xmax);
  b.ymin = bmin;
  b.ymax = bmax;
  pad_range(b.ymin, b.ymax);

  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1200\" height=\"420\" viewBox=\"0 0 1200 420\" "
                    "font-family=\"sans-serif\">\n";
  svg += axes(a, "cumulative training FLOPs", "training loss (nats/token)", "loss vs compute");
  svg += axes(b, "training FLOPs/token", metric, metric + " vs FLOPs/token");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const char* col = kColors[i % 10];
    std::string pts;
    for (const auto& [f, l] : r.loss) pts += fmt::format("{:.2f},{:.2f} ", a.X(f), a.Y(l));
    if (!pts.empty()) pts.pop_back();
    svg += fmt::format("<polyline class=\"loss\" data-method=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.2\" "
                       "points=\"{}\"/>\n",
                       esc(r.method), col, pts);
    if (std::isfinite(r.bpb))
      svg += fmt::format(
          "<circle class=\"bpb\" data-method=\"{0}\" cx=\"{1:.2f}\" cy=\"{2:.2f}\" r=\"4\" fill=\"{3}\"/>"
          "<text x=\"{4:.2f}\" y=\"{5:.2f}\" font-size=\"10\" fill=\"{3}\">{0} {6:.3f}</text>\n",
          esc(r.method), b.X(r.fpt), b.Y(r.bpb), col, b.X(r.fpt) + 6, b.Y(r.bpb) + 3, r.bpb);
    // legend under the loss panel
    const double lx = a.x0 + double(i % 4) * 110, ly = a.y0 + a.h + 50 + double(i / 4) * 14;
    svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{:.1f}\" "
                       "y=\"{:.1f}\" font-size=\"11\">{}</text>\n",
                       lx, ly - 9, col, lx + 14, ly, esc(r.method));
  }
  svg += "</svg>\n";
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" + esc(title) +
         "</title>\n<style>body{font-family:sans-serif;margin:1.5em}pre{background:#f6f6f6;padding:1em;"
         "overflow-x:auto}</style>\n</head>\n<body>\n<h1>" +
         esc(title) + "</h1>\n" + svg + "<h2>Table</h2>\n<pre>" + esc(markdown) + "</pre>\n</body>\n</html>\n";
}

}  // namespace mixbench
