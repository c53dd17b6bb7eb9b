#include "suites/train.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>

#include "harness/errors.h"
#include "harness/io.h"
#include "harness/registry.h"
#include "harness/report.h"
#include "harness/safetensors.h"
#include "suites/train_eval.h"

namespace mixbench {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// ------------------------------------------------------------------ schedules
namespace {
int64_t warmdown_iters(const Schedule& s) {
  // Python's round(): half to even, which nearbyint does in the default rounding mode.
  return int64_t(std::nearbyint(s.warmdown_ratio * double(s.steps)));
}
}  // namespace

double lr_multiplier(const Schedule& s, int64_t it) {
  const int64_t wd = warmdown_iters(s);
  if (it < s.warmup) return double(it + 1) / double(s.warmup);
  if (it <= s.steps - wd) return 1.0;
  const double progress = double(s.steps - it) / double(wd);
  return progress * 1.0 + (1.0 - progress) * s.final_lr_frac;
}

double muon_momentum(const Schedule& s, int64_t it) {
  const int64_t wd = warmdown_iters(s);
  const int64_t start = s.steps - wd;
  if (it < s.momentum_warmup) {
    const double frac = double(it) / double(s.momentum_warmup);
    return (1 - frac) * 0.85 + frac * 0.97;
  }
  if (it >= start) {
    const double progress = double(it - start) / double(wd);
    return 0.97 * (1 - progress) + 0.90 * progress;
  }
  return 0.97;
}

double muon_weight_decay(const Schedule& s, int64_t it, double wd0) {
  return wd0 * 0.5 * (1 + std::cos(M_PI * double(it) / double(s.steps)));
}

// ------------------------------------------------------------------ optimizer pieces
namespace {
constexpr double kPolarExpress[5][3] = {
    {8.156554524902461, -22.48329292557795, 15.878769915207462},
    {4.042929935166739, -2.808917465908714, 0.5000178451051316},
    {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
    {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
    {2.3465413258596377, -1.7097828382687081, 0.42323551169305323},
};
}  // namespace

at::Tensor polar_express(const at::Tensor& X0, int steps) {
  if (X0.dim() != 2) throw InputError("polar_express takes a 2-D matrix");
  at::Tensor X = X0 / (X0.norm() * 1.01 + 1e-6);
  const bool tall = X.size(0) > X.size(1);
  for (int i = 0; i < std::min(steps, 5); ++i) {
    const double a = kPolarExpress[i][0], b = kPolarExpress[i][1], c = kPolarExpress[i][2];
    if (tall) {
      at::Tensor A = at::matmul(X.t(), X);
      at::Tensor B = b * A + c * at::matmul(A, A);
      X = a * X + at::matmul(X, B);
    } else {
      at::Tensor A = at::matmul(X, X.t());
      at::Tensor B = b * A + c * at::matmul(A, A);
      X = a * X + at::matmul(B, X);
    }
  }
  return X;
}

void adamw_update(at::Tensor& p, const at::Tensor& g, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, int64_t step,
                  double lr, double beta1, double beta2, double eps, double wd) {
  c10::NoGradGuard ng;
  // fp32 math at least (parameters may be stored in lower precision); fp64 stays fp64
  const auto ct = at::promote_types(p.scalar_type(), at::kFloat);
  at::Tensor g32 = g.to(ct);
  at::Tensor p32 = p.to(ct);
  p32.mul_(1 - lr * wd);
  exp_avg.lerp_(g32, 1 - beta1);
  exp_avg_sq.lerp_(g32.square(), 1 - beta2);
  const double bias1 = 1 - std::pow(beta1, double(step));
  const double bias2 = 1 - std::pow(beta2, double(step));
  at::Tensor denom = (exp_avg_sq / bias2).sqrt() + eps;
  p32.add_(exp_avg / denom, -lr / bias1);
  p.copy_(p32);
}

void muon_update(at::Tensor& p, const at::Tensor& grad, at::Tensor& buf, at::Tensor& buf2, double momentum, double lr,
                 double wd, double beta2, bool bf16) {
  c10::NoGradGuard ng;
  const int64_t rows = p.size(0), cols = p.size(1);
  // Nesterov momentum
  buf.lerp_(grad, 1 - momentum);
  at::Tensor g = grad.lerp(buf, momentum);
  at::Tensor X = bf16 ? g.to(at::kBFloat16) : g;
  // Row equilibration: every row to the mean row norm
  at::Tensor Xf = X.to(at::kFloat);
  at::Tensor target = Xf.norm() / std::sqrt(double(rows));
  at::Tensor row_norm = Xf.norm(2, {-1}, true).clamp_min(1e-6);
  X = X * (target / row_norm).to(X.scalar_type());
  X = polar_express(X, 5);
  g = X.to(p.scalar_type());
  // Frobenius norm of an exactly semi-orthogonal matrix
  const double target_norm = std::sqrt(double(std::min(rows, cols)));
  g = g * (target_norm / g.to(at::kFloat).norm().clamp_min(1e-6)).to(g.scalar_type());
  // NorMuon variance reduction
  const int64_t red_dim = rows >= cols ? -1 : -2;
  const double red_size = double(g.size(red_dim));
  at::Tensor v_mean = g.to(at::kFloat).square().mean({red_dim}, true);
  at::Tensor v_norm = (v_mean.sum() * red_size).sqrt();
  buf2.lerp_(v_mean.to(buf2.scalar_type()), 1 - beta2);
  at::Tensor step_size = buf2.clamp_min(1e-10).rsqrt();
  at::Tensor v_norm_new = ((v_mean * red_size) * step_size.to(at::kFloat).square()).sum().sqrt();
  at::Tensor final_scale = step_size * (v_norm / v_norm_new.clamp_min(1e-10));
  g = g * final_scale.to(g.scalar_type());
  // Cautious weight decay and the update
  const double lr_eff = lr * std::sqrt(std::max(1.0, double(rows) / double(cols)));
  at::Tensor mask = (g * p >= 0).to(p.scalar_type());
  p.sub_(lr_eff * g + lr_eff * wd * p * mask);
}

// ------------------------------------------------------------------ Optimizer
Optimizer::Optimizer(const Model& m, int64_t batch_tokens, const TrainHyper& h) : h_(h) {
  const double bs = std::sqrt(double(batch_tokens) / h.batch_tokens_ref);
  const double ds = std::pow(double(m.dims.d_model) / 768.0, -0.5);
  std::map<std::string, std::pair<OptimRule, std::string>> declared;  // group -> (rule, first parameter)
  for (const auto& [name, t] : m.params) {
    const OptimRule rule = m.defs.at(name).optim_rule();
    auto [it, fresh] = declared.emplace(rule.group, std::make_pair(rule, name));
    if (!fresh && it->second.first != rule)
      throw std::logic_error(fmt::format("parameters {} and {} share optimizer group '{}' with different hyper-parameters",
                                         it->second.second, name, rule.group));
    const bool muon = rule.kind == OptimKind::Muon;
    if (muon && t.dim() != 2)
      throw std::logic_error(fmt::format("parameter {} is in a Muon group but is not a matrix", name));
    if (fresh) {
      double lr = rule.lr;
      if (rule.batch_scaled) lr = lr * bs;
      if (rule.width_scaled) lr = lr * ds;
      groups_.push_back({rule.group, muon, lr, rule.beta1, rule.beta2, rule.wd});
      group_index_[rule.group] = groups_.size() - 1;
    }
    group_of_[name] = group_index_.at(rule.group);
    auto o = t.options().requires_grad(false);
    if (muon) {
      m1_[name] = at::zeros(t.sizes(), o);
      m2_[name] = t.size(0) >= t.size(1) ? at::zeros({t.size(0), 1}, o) : at::zeros({1, t.size(1)}, o);
    } else {
      m1_[name] = at::zeros(t.sizes(), o.dtype(at::kFloat));
      m2_[name] = at::zeros(t.sizes(), o.dtype(at::kFloat));
    }
  }
}

std::string Optimizer::group_of(const std::string& p) const { return groups_.at(group_of_.at(p)).name; }
double Optimizer::base_lr(const std::string& p) const { return groups_.at(group_of_.at(p)).lr; }

void Optimizer::step(Model& m, int64_t it) {
  c10::NoGradGuard ng;
  const double lrm = lr_multiplier(h_.schedule, it);
  const double mom = muon_momentum(h_.schedule, it);
  const double wd = muon_weight_decay(h_.schedule, it, h_.muon_wd);
  ++adam_step_;
  for (const auto& [name, t] : m.params) {
    const Group& g = groups_[group_of_.at(name)];
    at::Tensor p = t;
    at::Tensor grad = t.grad();
    if (!grad.defined()) grad = at::zeros_like(t);
    if (g.muon) muon_update(p, grad, m1_.at(name), m2_.at(name), mom, g.lr * lrm, wd, g.beta2, h_.muon_bf16);
    else adamw_update(p, grad, m1_.at(name), m2_.at(name), adam_step_, g.lr * lrm, g.beta1, g.beta2, 1e-10, g.wd);
  }
}

TensorMap Optimizer::state() const {
  TensorMap s;
  for (const auto& [n, t] : m1_) s.set("m1." + n, t);
  for (const auto& [n, t] : m2_) s.set("m2." + n, t);
  s.set("adam_step", at::full({1}, adam_step_, at::TensorOptions().dtype(at::kLong)));
  return s;
}

void Optimizer::load_state(const TensorMap& s) {
  c10::NoGradGuard ng;
  for (auto* mp : {&m1_, &m2_})
    for (auto& [n, t] : *mp) {
      const std::string key = (mp == &m1_ ? "m1." : "m2.") + n;
      if (!s.has(key)) throw InputError("checkpoint lacks optimizer state " + key);
      const at::Tensor& src = s.at(key);
      if (src.sizes() != t.sizes()) throw InputError("checkpoint optimizer state " + key + " has the wrong shape");
      t.copy_(src);
    }
  if (!s.has("adam_step")) throw InputError("checkpoint lacks adam_step");
  adam_step_ = s.at("adam_step").item<int64_t>();
}

// ------------------------------------------------------------------ data
namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

const char* kWords[] = {"the", "a", "river", "stone", "light", "blue", "runs", "over", "under", "small",
                        "green", "house", "quiet", "fast", "and", "of", "tree", "sky", "old", "new",
                        "cold", "warm", "bird", "sings", "wind", "moves", "near", "far", "red", "road",
                        "sand", "glass"};

at::Tensor bytes_to_tokens(const std::vector<int64_t>& v) {
  return at::tensor(at::ArrayRef<int64_t>(v), at::TensorOptions().dtype(at::kLong)).clone();
}
}  // namespace

std::string synthetic_document(uint64_t seed, int64_t index) {
  std::mt19937_64 rng(splitmix64(splitmix64(seed) ^ uint64_t(index)));
  auto uni = [&](int64_t lo, int64_t hi) { return lo + int64_t(rng() % uint64_t(hi - lo + 1)); };
  std::vector<std::pair<std::string, std::string>> facts;
  const int64_t n_facts = uni(3, 8);
  std::string doc = "facts:";
  for (int64_t i = 0; i < n_facts; ++i) {
    std::string k, v;
    for (int64_t j = 0, n = uni(3, 5); j < n; ++j) k += char('a' + uni(0, 25));
    for (int64_t j = 0, n = uni(2, 4); j < n; ++j) v += char('0' + uni(0, 9));
    facts.emplace_back(k, v);
    doc += " " + k + "=" + v + ";";
  }
  doc += "\n";
  for (int64_t s = 0, n = uni(8, 16); s < n; ++s) {
    const int64_t kind = uni(0, 2);
    if (kind == 0) {  // filler sentence
      for (int64_t w = 0, nw = uni(4, 10); w < nw; ++w) doc += std::string(w ? " " : "") + kWords[uni(0, 31)];
      doc += ".\n";
    } else if (kind == 1) {  // recall a fact stated at the top
      const auto& f = facts[size_t(uni(0, n_facts - 1))];
      doc += "what is " + f.first + "? " + f.second + ".\n";
    } else {  // verbatim copy of an earlier span
      const int64_t len = std::min<int64_t>(uni(16, 48), int64_t(doc.size()));
      const int64_t start = uni(0, int64_t(doc.size()) - len);
      const std::string span = doc.substr(size_t(start), size_t(len));
      doc += "copy: " + span + "\n";
    }
  }
  return doc;
}

Corpus synthetic_corpus(uint64_t seed, int64_t train_bytes, int64_t val_bytes, int64_t probe_T) {
  Corpus c;
  const std::vector<ProbeSpec> probes = probe_T > 0 ? probe_suite(probe_T) : std::vector<ProbeSpec>{};
  auto build = [&](uint64_t s, int64_t n) {
    std::vector<int64_t> v;
    v.reserve(size_t(n + 1024));
    for (int64_t i = 0; int64_t(v.size()) < n; ++i) {
      v.push_back(kByteBos);
      if (!probes.empty() && i % 2 == 1) {
        const int64_t k = i / 2;
        const ProbeSeq p = probes[size_t(k % int64_t(probes.size()))].make(s, k / int64_t(probes.size()));
        v.insert(v.end(), p.tokens.begin(), p.tokens.end());
        continue;
      }
      for (unsigned char ch : synthetic_document(s, i)) v.push_back(ch);
    }
    v.resize(size_t(n));
    return bytes_to_tokens(v);
  };
  c.train = build(seed, train_bytes);
  c.val = build(seed ^ 0x7A11D47AC0FFEEull, val_bytes);
  c.byte_level = true;
  c.max_token = kByteBos;
  c.source = fmt::format("synthetic(seed={},train_bytes={},val_bytes={})", seed, train_bytes, val_bytes);
  if (probe_T > 0) c.source += fmt::format("+probes(T={})", probe_T);
  c.hash = fnv1a_hex("synthetic-v1:" + c.source);
  return c;
}

namespace {
std::vector<std::string> list_files(const std::string& path, const std::string& ext) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError(fmt::format("data path '{}' does not exist", path));
  std::vector<std::string> files;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::recursive_directory_iterator(path))
      if (e.is_regular_file() && (ext.empty() || e.path().extension() == ext)) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  if (files.empty()) throw InputError(fmt::format("data folder '{}' holds no {} files", path, ext.empty() ? "" : ext));
  return files;
}

void split_corpus(Corpus& c, const at::Tensor& all) {
  const int64_t n = all.size(0);
  const int64_t nval = std::max<int64_t>(n / 10, 1);
  if (n - nval < 2) throw InputError(fmt::format("data '{}' is too short ({} tokens)", c.source, n));
  c.train = all.slice(0, 0, n - nval).clone();
  c.val = all.slice(0, n - nval).clone();
  c.max_token = all.max().item<int64_t>();
}
}  // namespace

Corpus text_corpus(const std::string& path) {
  Corpus c;
  c.source = path;
  std::vector<int64_t> v;
  std::string hash_text = "text-v1";
  for (const auto& f : list_files(path, "")) {
    const std::string text = read_file(f);
    v.push_back(kByteBos);
    for (unsigned char ch : text) v.push_back(ch);
    hash_text += "\n" + f + ":" + fnv1a_hex(text);
  }
  c.hash = fnv1a_hex(hash_text);
  c.byte_level = true;
  split_corpus(c, bytes_to_tokens(v));
  return c;
}

at::Tensor read_bin_shard(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot open shard '{}'", path));
  int32_t header[256];
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  if (in.gcount() != sizeof(header))
    throw InputError(fmt::format("shard '{}' is truncated: the 1024-byte header is incomplete", path));
  if (header[0] != 20240520)
    throw InputError(fmt::format("shard '{}' has magic {} (expected 20240520): not a modded-nanogpt .bin shard", path, header[0]));
  if (header[1] != 1) throw InputError(fmt::format("shard '{}' has version {} (expected 1)", path, header[1]));
  const int64_t n = header[2];
  if (n < 0) throw InputError(fmt::format("shard '{}' declares a negative token count", path));
  std::vector<uint16_t> tok{};
  tok.resize(size_t(n));
  in.read(reinterpret_cast<char*>(tok.data()), std::streamsize(n * 2));
  if (in.gcount() != std::streamsize(n * 2))
    throw InputError(fmt::format("shard '{}' is truncated: header declares {} tokens, file holds {}", path, n,
                                 int64_t(in.gcount()) / 2));
  at::Tensor t = at::empty({n}, at::TensorOptions().dtype(at::kLong));
  int64_t* p = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = tok[size_t(i)];
  return t;
}

Corpus bin_corpus(const std::string& path) {
  Corpus c;
  c.source = path;
  c.byte_level = false;
  c.bos = 50256;  // GPT-2 end-of-text, which prefixes each document in the shards
  std::vector<at::Tensor> train, val;
  std::string hash_text = "bin-v1";
  for (const auto& f : list_files(path, ".bin")) {
    at::Tensor t = read_bin_shard(f);
    hash_text += "\n" + f + ":" + std::to_string(t.size(0));
    (fs::path(f).filename().string().find("val") != std::string::npos ? val : train).push_back(t);
  }
  c.hash = fnv1a_hex(hash_text);
  if (train.empty()) throw InputError(fmt::format("data '{}' holds only validation shards", path));
  if (val.empty()) {
    split_corpus(c, at::cat(train));
  } else {
    c.train = at::cat(train);
    c.val = at::cat(val);
    c.max_token = std::max(c.train.max().item<int64_t>(), c.val.max().item<int64_t>());
  }
  return c;
}

Corpus load_corpus(const std::string& data, uint64_t seed, int64_t probe_T, int64_t train_tokens) {
  if (data == "synthetic")
    return synthetic_corpus(seed, std::max(int64_t(1) << 21, train_tokens), int64_t(1) << 16, probe_T);
  std::error_code ec;
  if (fs::is_directory(data, ec)) {
    for (const auto& e : fs::recursive_directory_iterator(data))
      if (e.is_regular_file() && e.path().extension() == ".bin") return bin_corpus(data);
    return text_corpus(data);
  }
  if (fs::path(data).extension() == ".bin") return bin_corpus(data);
  return text_corpus(data);
}

void get_batch(const at::Tensor& stream, int64_t pos, int64_t B, int64_t T, at::Tensor& x, at::Tensor& y) {
  const int64_t N = stream.size(0);
  if (N < T + 1) throw InputError(fmt::format("token stream of {} tokens is shorter than one row of {}", N, T + 1));
  at::Tensor off = at::arange(B * (T + 1), at::TensorOptions().dtype(at::kLong)) + pos;
  at::Tensor rows = stream.index_select(0, at::remainder(off, N)).view({B, T + 1});
  x = rows.slice(1, 0, T).contiguous();
  y = rows.slice(1, 1).contiguous();
}

// ------------------------------------------------------------------ training
std::string TrainPreset::config_for(const std::string& method) const {
  auto it = method_config.find(method);
  return it == method_config.end() ? config : config + "," + it->second;
}

TrainPreset train_preset(const std::string& name) {
  const nlohmann::ordered_json& table = train_presets_table();
  if (!table.contains(name)) {
    std::string known;
    for (const auto& [k, v] : table.items()) known += (known.empty() ? "" : ", ") + k;
    throw UsageError(fmt::format("unknown preset '{}' (known: {})", name, known));
  }
  const nlohmann::ordered_json& j = table.at(name);
  TrainPreset p;
  p.name = name;
  p.config = j.at("config").get<std::string>();
  p.steps = j.at("steps").get<int64_t>();
  p.batch = j.at("batch").get<int64_t>();
  p.eval_every = j.at("eval_every").get<int64_t>();
  p.eval_batches = j.at("eval_batches").get<int64_t>();
  p.checkpoint_every = j.at("checkpoint_every").get<int64_t>();
  p.probe_sequences = j.at("probe_sequences").get<int64_t>();
  p.cpu_threads = j.at("cpu_threads").get<int>();
  p.hyper.batch_tokens_ref = j.at("batch_tokens_ref").get<double>();
  p.hyper.muon_wd = j.at("muon_wd").get<double>();
  p.hyper.muon_bf16 = j.at("muon_bf16").get<bool>();
  p.anchor = j.at("anchor").get<std::string>();
  p.baseline = j.at("baseline").get<std::string>();
  if (j.at("lineup").is_array()) p.lineup = j.at("lineup").get<std::vector<std::string>>();
  else if (j.at("lineup") != "all") throw std::logic_error("preset " + name + ": lineup is a list of methods or \"all\"");
  // What each method needs at this preset, as it declares it where it is registered.
  for (const auto* m : Registry::get().methods()) {
    auto it = m->presets.find(name);
    if (it == m->presets.end()) continue;
    if (!it->second.config.empty()) p.method_config[m->name] = it->second.config;
    if (it->second.micro_batch > 0) p.method_micro_batch[m->name] = it->second.micro_batch;
  }
  return p;
}

namespace {
// Logits of idx [R, T] computed `micro` rows at a time (all at once for micro ≥ R).
at::Tensor forward_rows(const Model& m, const at::Tensor& idx, Backend backend, int64_t micro) {
  if (micro <= 0 || micro >= idx.size(0)) return model_forward(m, idx, backend);
  std::vector<at::Tensor> parts;
  for (int64_t r0 = 0; r0 < idx.size(0); r0 += micro)
    parts.push_back(model_forward(m, idx.slice(0, r0, std::min(idx.size(0), r0 + micro)), backend));
  return at::cat(parts, 0);
}

double evaluate(const Model& m, const Corpus& c, int64_t B, int64_t T, int64_t n_batches, Backend backend,
                int64_t micro) {
  c10::NoGradGuard ng;
  double nats = 0, count = 0;
  const at::Device dev = m.params.at("wte").device();
  for (int64_t k = 0; k < n_batches; ++k) {
    at::Tensor x, y;
    get_batch(c.val, k * B * (T + 1), B, T, x, y);
    x = x.to(dev);
    y = y.to(dev);
    at::Tensor logits = forward_rows(m, x, backend, micro);
    at::Tensor ce = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}), {},
                                           at::Reduction::None, -1).to(at::kDouble);
    at::Tensor w = c.byte_level ? (y.reshape({-1}) != c.bos).to(at::kDouble) : at::ones_like(ce);
    nats += (ce * w).sum().item<double>();
    count += w.sum().item<double>();
  }
  return count > 0 ? nats / (std::log(2.0) * count) : 0.0;
}

std::string fingerprint(const TrainResult& r, int64_t steps, int64_t B, uint64_t seed, const std::string& data_hash) {
  return fnv1a_hex(fmt::format("{}|{}|{}|{}|{}|{}", r.method, r.cfg.str(), steps, B, seed, data_hash));
}
}  // namespace

TrainResult run_train(const TrainOptions& opt) {
  const TrainPreset P = train_preset(opt.preset);
  const MethodSpec& ms = Registry::get().method(opt.method);
  const int64_t steps = opt.steps > 0 ? opt.steps : P.steps;
  const int64_t B = opt.batch > 0 ? opt.batch : P.batch;
  auto preset_micro = P.method_micro_batch.find(opt.method);
  const int64_t MB = opt.micro_batch > 0 ? opt.micro_batch
                     : preset_micro != P.method_micro_batch.end() ? std::min(preset_micro->second, B)
                                                                   : B;
  if (MB < 1 || B % MB != 0)
    throw UsageError(fmt::format("--micro-batch {} must divide the batch of {} rows", MB, B));
  const int64_t eval_every = opt.eval_every > 0 ? opt.eval_every : P.eval_every;
  const int64_t eval_batches = opt.eval_batches > 0 ? opt.eval_batches : P.eval_batches;
  const int64_t ckpt_every = opt.checkpoint_every > 0 ? opt.checkpoint_every : P.checkpoint_every;
  if (opt.resume && opt.out.empty()) throw UsageError("--resume needs --out DIR (where the checkpoint is)");
  TrainResult r;
  r.method = ms.name;
  r.cfg = ms.config.parse(P.config_for(ms.name) + (opt.config.empty() ? "" : "," + opt.config));
  const ModelDims d = model_dims(r.cfg);
  const int64_t T = d.seq_len;
  Corpus corpus = load_corpus(opt.data, opt.seed, T, steps * B * (T + 1));
  r.byte_level = corpus.byte_level;
  if (corpus.max_token >= d.vocab)
    throw InputError(fmt::format("data holds token {} but the vocabulary has {} entries (set vocab=)", corpus.max_token,
                                 d.vocab));
  CostQuery q;
  q.T = T;
  r.cost = account_model(ms, r.cfg, q);

  if (opt.device != "cpu" && opt.device != "cuda")
    throw UsageError(fmt::format("unknown device '{}' (cpu or cuda)", opt.device));
  if (opt.device == "cuda" && !at::hasCUDA()) throw UsageError("--device cuda: no CUDA device is available");
  const at::Device dev = opt.device == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  const Backend backend = opt.device == "cuda" ? Backend::CUDA : Backend::CPU;
  r.device = opt.device;
  if (opt.device == "cuda") at::globalContext().setAllowTF32CuBLAS(true);  // fp32 weights, TF32 matmuls
  // Small CPU models: the per-op work is too small for intra-op threads to pay off, and on a loaded
  // machine their synchronisation costs more than the work (measured 13× slower with 2 threads).
  struct ThreadsGuard {
    int saved = 0;
    explicit ThreadsGuard(int n) {
      if (n > 0) {
        saved = at::get_num_threads();
        at::set_num_threads(n);
      }
    }
    ~ThreadsGuard() {
      if (saved > 0) at::set_num_threads(saved);
    }
  } threads_guard(opt.device == "cpu" ? P.cpu_threads : 0);
  r.threads = opt.device == "cpu" ? at::get_num_threads() : 0;

  // Parameters are drawn on the CPU (the same values on every device), then moved.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
  Model model = build_model(ms, r.cfg, gen, at::TensorOptions().dtype(at::kFloat));
  if (dev.is_cuda()) {
    std::vector<std::string> names;
    for (const auto& [n, t] : model.params) names.push_back(n);
    for (const auto& n : names) model.params.set(n, model.params.at(n).to(dev));
  }
  for (const auto& [n, t] : model.params) t.requires_grad_(true);
  TrainHyper h = P.hyper;
  h.schedule.steps = steps;
  Optimizer optim(model, B * T, h);

  // a different micro-batching changes the rounding of the accumulated gradients: part of the run
  const std::string fp = fingerprint(r, steps, B, opt.seed, corpus.hash) + (MB == B ? "" : fmt::format("/mb{}", MB));
  const std::string ckpt = opt.out.empty() ? "" : (fs::path(opt.out) / "checkpoint.safetensors").string();
  int64_t start = 0, pos = 0;
  double prior_seconds = 0;
  if (opt.resume) {
    SafetensorsFile f = read_safetensors(ckpt);
    auto meta = [&](const std::string& k) {
      auto it = f.metadata.find(k);
      if (it == f.metadata.end()) throw InputError(fmt::format("checkpoint '{}' lacks '{}'", ckpt, k));
      return it->second;
    };
    // The per-layer layout (a hybrid's layer methods) must be the model's, layer by layer.
    if (f.metadata.count("layer_mixers") || ms.is_hybrid()) {
      std::vector<std::string> saved;
      try {
        saved = Json::parse(meta("layer_mixers")).get<std::vector<std::string>>();
      } catch (const Json::exception&) {
        throw InputError(fmt::format("checkpoint '{}': layer_mixers is not a list of method names", ckpt));
      }
      auto join = [](const std::vector<std::string>& v) {
        std::string s;
        for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
        return s;
      };
      if (saved != model.layer_mixers)
        throw InputError(fmt::format("checkpoint '{}' has the layer layout [{}] but {} at this config has [{}]", ckpt,
                                     join(saved), r.method, join(model.layer_mixers)));
    }
    if (meta("fingerprint") != fp)
      throw InputError(fmt::format("checkpoint '{}' belongs to a different run (method, config, steps, batch, seed "
                                   "or data differ)", ckpt));
    start = std::stoll(meta("step"));
    pos = std::stoll(meta("data_pos"));
    prior_seconds = std::stod(meta("seconds"));
    r.losses = Json::parse(meta("losses")).get<std::vector<double>>();
    if (f.metadata.count("aux_losses")) r.aux_losses = Json::parse(meta("aux_losses")).get<std::vector<double>>();
    for (const auto& e : Json::parse(meta("val_curve"))) r.val_curve.emplace_back(e[0].get<int64_t>(), e[1].get<double>());
    c10::NoGradGuard ng;
    TensorMap opt_state;
    for (const auto& [n, t] : f.tensors) {
      if (n.rfind("param.", 0) == 0) {
        const std::string pn = n.substr(6);
        if (!model.params.has(pn) || model.params.at(pn).sizes() != t.sizes())
          throw InputError(fmt::format("checkpoint parameter '{}' does not fit the model", pn));
        model.params.at(pn).copy_(t);
      } else if (n.rfind("opt.", 0) == 0) {
        opt_state.set(n.substr(4), t);
      }
    }
    optim.load_state(opt_state);
    if (f.tensors.has("rng_state")) gen.set_state(f.tensors.at("rng_state"));
    if (int64_t(r.losses.size()) != start) throw InputError("checkpoint loss history does not match its step");
  }

  auto save = [&](int64_t step_done, double seconds) {
    if (ckpt.empty()) return;
    fs::create_directories(opt.out);
    TensorMap t;
    for (const auto& [n, p] : model.params) t.set("param." + n, p.detach().cpu());
    for (const auto& [n, s] : optim.state()) t.set("opt." + n, s.cpu());
    t.set("rng_state", gen.get_state());
    Json vc = Json::array();
    for (const auto& [s, v] : r.val_curve) vc.push_back({s, v});
    write_safetensors(ckpt, t,
                      {{"fingerprint", fp}, {"step", std::to_string(step_done)}, {"data_pos", std::to_string(pos)},
                       {"seconds", fmt::format("{:.17g}", seconds)}, {"losses", Json(r.losses).dump()},
                       {"val_curve", vc.dump()}, {"method", r.method}, {"config", r.cfg.str()},
                       {"layer_mixers", Json(model.layer_mixers).dump()},
                       {"aux_losses", Json(r.aux_losses).dump()}});
  };

  const int64_t N = corpus.train.size(0);
  double seconds = 0;
  int64_t tokens_now = 0;
  int64_t done = start;
  for (int64_t it = start; it < steps; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    at::Tensor x, y;
    get_batch(corpus.train, pos, B, T, x, y);
    pos = (pos + B * (T + 1)) % N;
    if (dev.is_cuda()) {
      x = x.to(dev);
      y = y.to(dev);
    }
    // The layers see the step (the sparse methods' full-attention warm-up); the evaluations
    // after it run the model as this step trained it.
    model.step = it;
    // The step's rows in micro-batches of MB: each micro-batch's mean loss weighted by MB/B, so the
    // accumulated gradient (and the logged losses) are the whole batch's means.
    double lm_sum = 0, aux_sum = 0;
    bool have_aux = false;
    for (int64_t r0 = 0; r0 < B; r0 += MB) {
      at::Tensor lm_loss;
      ModelAux aux;
      const double w = double(MB) / double(B);
      at::Tensor loss = model_loss(model, MB == B ? x : x.slice(0, r0, r0 + MB), MB == B ? y : y.slice(0, r0, r0 + MB),
                                   backend, &lm_loss, &aux);
      (MB == B ? loss : loss * w).backward();
      lm_sum += w * lm_loss.item<double>();
      if (aux.aux_loss.defined()) {
        aux_sum += w * aux.aux_loss.item<double>();
        have_aux = true;
      }
    }
    r.losses.push_back(lm_sum);
    if (have_aux) r.aux_losses.push_back(aux_sum);
    optim.step(model, it);
    for (const auto& [n, p] : model.params) p.mutable_grad() = at::Tensor();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    tokens_now += B * T;
    done = it + 1;
    const bool do_eval = done % eval_every == 0 || done == steps;
    if (do_eval) r.val_curve.emplace_back(done, evaluate(model, corpus, B, T, eval_batches, backend, MB));
    if (opt.progress) {
      const double tps = double(tokens_now) / std::max(seconds, 1e-9);
      const double eta = double(steps - done) * double(B * T) / std::max(tps, 1e-9);
      if (opt.progress == 1) {
        Json j = {{"method", r.method}, {"step", done}, {"steps", steps}, {"loss", r.losses.back()},
                  {"lr_mult", lr_multiplier(h.schedule, it)}, {"tok_per_s", tps}, {"eta_s", eta}};
        if (!r.aux_losses.empty()) j["aux_loss"] = r.aux_losses.back();
        if (do_eval) j["val_bpb"] = r.val_curve.back().second;
        std::cout << j.dump() << std::endl;
      } else if (do_eval || done % 10 == 0) {
        std::cout << fmt::format("{} step {}/{}  loss {:.4f}{}{}  {:.0f} tok/s  eta {:.0f}s\n", r.method, done, steps,
                                 r.losses.back(),
                                 r.aux_losses.empty() ? "" : fmt::format("  aux {:.4f}", r.aux_losses.back()),
                                 do_eval ? fmt::format("  val bpb {:.4f}", r.val_curve.back().second) : "", tps, eta)
                  << std::flush;
      }
    }
    const bool stopping = opt.stop_after > 0 && done >= opt.stop_after;
    if (done % ckpt_every == 0 || done == steps || stopping) save(done, prior_seconds + seconds);
    if (stopping) break;
  }
  r.steps_done = done;
  r.tokens = done * B * T;
  r.batch = B;
  r.micro_batch = MB;
  r.seconds = prior_seconds + seconds;
  r.tokens_per_s = tokens_now > 0 ? double(tokens_now) / std::max(seconds, 1e-9) : 0.0;
  if (!r.val_curve.empty()) r.val_bpb = r.val_curve.back().second;
  const int64_t n_probe = opt.probe_sequences >= 0 ? opt.probe_sequences : P.probe_sequences;
  if (corpus.byte_level && n_probe > 0) {
    r.probes = evaluate_probes([&](const at::Tensor& idx) { return forward_rows(model, idx.to(dev), backend, MB); }, T,
                               opt.seed, n_probe, corpus.bos);
  }
  return r;
}

Json train_result_json(const TrainResult& r) {
  const ModelDims d = model_dims(r.cfg);
  Json vc = Json::array();
  for (const auto& [s, v] : r.val_curve) vc.push_back({{"step", s}, {r.byte_level ? "bpb" : "bits_per_token", v}});
  return {{"status", "ok"},
          {"method", r.method},
          {"level", "model"},
          {"device", r.device},
          {"threads", r.threads},
          {"dtype", "fp32"},
          {"config", r.cfg.to_json()},
          {"shape", {{"n_layer", d.n_layer}, {"d_model", d.d_model}, {"n_head", d.n_head}, {"head_dim", d.head_dim},
                     {"seq_len", d.seq_len}, {"vocab", d.vocab}}},
          {r.byte_level ? "val_bpb" : "val_bits_per_token", r.val_bpb},
          {"steps", r.steps_done},
          {"batch", r.batch},
          {"micro_batch", r.micro_batch},
          {"tokens", r.tokens},
          {"seconds", r.seconds},
          {"tokens_per_s", r.tokens_per_s},
          {"train_flops_per_token_nanochat", r.cost.train_flops_nanochat},
          {"params", {{"total", r.cost.params.total()}, {"matmul", r.cost.params.matmul}}},
          {"loss_curve", r.losses},
          {"aux_loss_curve", r.aux_losses},
          {"val_curve", vc},
          {"probes", r.probes.is_null() ? Json::object() : r.probes}};
}

// ------------------------------------------------------------------ leaderboard
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

Json run_leaderboard(const LeaderboardOptions& opt, std::string& md) {
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
  Json results = Json::array();
  for (const auto& m : methods) {
    Calibration cal = calibrate(m, opt.preset, opt.config);
    TrainOptions to;
    to.method = m;
    to.preset = opt.preset;
    to.config = cal.config + (opt.config.empty() ? "" : "," + opt.config);
    to.steps = opt.steps;
    to.batch = opt.batch;
    to.micro_batch = opt.micro_batch;
    to.seed = opt.seed;
    to.data = opt.data;
    to.progress = opt.progress;
    to.probe_sequences = opt.probe_sequences;
    to.device = opt.device;
    Json row;
    try {
      TrainResult tr = run_train(to);
      row = train_result_json(tr);
    } catch (const UsageError&) {
      throw;
    } catch (const c10::Error& e) {  // e.g. CUDA out of memory: the message, not LibTorch's backtrace
      row = {{"status", "error"}, {"method", m}, {"message", e.what_without_backtrace()}};
    } catch (const std::exception& e) {
      row = {{"status", "error"}, {"method", m}, {"message", e.what()}};
    }
    row["calibration"] = {{"n_layer", cal.n_layer}, {"d_model", cal.d_model},
                          {"mlp_hidden", cal.mlp_hidden ? cal.mlp_hidden : 4 * cal.d_model}, {"flops_per_token", cal.flops},
                          {"anchor_flops_per_token", cal.anchor_flops}, {"residual", cal.residual},
                          {"within_2pct", cal.within}};
    results.push_back(row);
  }
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
  md = fmt::format("| rank | method | val {} | FLOPs/token | calibration | params | tokens | tok/s | Δ vs {} |\n",
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
  return results;
}

}  // namespace mixbench
