#include "suites/tasks_data.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <random>

#include "harness/errors.h"

namespace mixbench {

using Json = nlohmann::json;

namespace {

// MAD's defaults (mad/configs: vocab 16, noisy recall 32 with 16 noise tokens at 20%, memorization
// 256) and Zoology's MQAR vocabulary.
constexpr int64_t kNoisyNoiseVocab = 16;
constexpr double kNoisyFraction = 0.2;
constexpr int64_t kMotifMax = 3;           // fuzzy recall: key and value motifs of 1..3 tokens
constexpr uint64_t kMemorizationSeed = 12345;  // MAD's kv_map_seed: one map for every run
constexpr double kPowerA = 0.01;           // Zoology's train_power_a / test_power_a

struct Draw {
  std::mt19937_64 g;
  explicit Draw(uint64_t seed) : g(splitmix64(seed)) {}
  int64_t below(int64_t n) { return int64_t(g() % uint64_t(n)); }  // uniform in [0, n)
  double unit() { return double(g() >> 11) * 0x1.0p-53; }
  // k distinct values from [lo, hi), in draw order
  std::vector<int64_t> distinct(int64_t lo, int64_t hi, int64_t k) {
    std::vector<int64_t> pool(static_cast<size_t>(hi - lo));
    std::iota(pool.begin(), pool.end(), lo);
    for (int64_t i = 0; i < k; ++i) std::swap(pool[size_t(i)], pool[size_t(i + below(hi - lo - i))]);
    pool.resize(size_t(k));
    return pool;
  }
};

void answer(ProbeSeq& s, int64_t tok) {
  s.answer_pos.push_back(int64_t(s.tokens.size()));
  s.tokens.push_back(tok);
}

int64_t default_vocab(const std::string& task) {
  if (task == "mqar") return 8192;
  if (task == "noisy_recall") return 32;
  if (task == "memorization") return 256;
  if (task == "s3" || task == "s5") return 256;  // probe_perm's byte tokens
  if (task == "parity") return 4;
  return 16;
}
int64_t vocab_of(const TaskSetting& s) { return s.vocab > 0 ? s.vocab : default_vocab(s.task); }
int64_t copy_count(int64_t length) { return std::max<int64_t>(1, length / 16); }  // MAD: 16 of 256
int64_t compression_n(int64_t length) { return (length - 1) / 3; }

uint64_t name_salt(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}
}  // namespace

// ------------------------------------------------------------------ the tasks
const std::vector<TaskInfo>& task_infos() {
  static const std::vector<TaskInfo> v = {
      {"mqar", "multi-query associative recall (Zoology): every key queried once after the pairs", false},
      {"in_context_recall", "MAD in-context recall: key-value pairs, values recalled for repeated keys", false},
      {"noisy_recall", "MAD noisy in-context recall: recall with 20% noise pairs from 16 noise tokens", false},
      {"fuzzy_recall", "MAD fuzzy in-context recall: keys and values are motifs of 1-3 tokens", false},
      {"selective_copy", "MAD selective copying: copy the tokens scattered among blanks, in order", false},
      {"compression", "compression: recall every token of the sequence by its position after a marker", false},
      {"memorization", "MAD memorization: one fixed key-value map shared by every instance", false},
      {"s3", "S3 word problem: running products of permutations of 3 elements", true},
      {"s5", "S5 word problem: running products of permutations of 5 elements", true},
      {"parity", "parity: running parity of a bit string", true},
  };
  return v;
}

const TaskInfo& task_info(const std::string& name) {
  std::string known;
  for (const auto& t : task_infos()) {
    if (t.name == name) return t;
    known += (known.empty() ? "" : ", ") + t.name;
  }
  throw UsageError(fmt::format("unknown task '{}' (known: {})", name, known));
}

std::string TaskSetting::label(int64_t test_length) const {
  std::string s = task;
  if (pairs > 0) s += fmt::format(" pairs={}", pairs);
  s += fmt::format(" len={} d={}", length, d_model);
  if (test_length > 0 && test_length != length) s += fmt::format(" test_len={}", test_length);
  return s;
}

Json TaskSetting::to_json(int64_t test_length) const {
  Json j = {{"task", task}, {"length", length}, {"d_model", d_model}, {"vocab", vocab_of(*this)},
            {"test_length", test_length > 0 ? test_length : length}};
  if (pairs > 0) j["pairs"] = pairs;
  return j;
}

int64_t task_vocab(const TaskSetting& s) {
  const int64_t v = vocab_of(s);
  if (s.task == "compression") {
    int64_t n = compression_n(s.length);
    for (int64_t t : s.test_lengths) n = std::max(n, compression_n(t));
    return v + n;
  }
  return v;
}

std::vector<int64_t> task_answer_alphabet(const TaskSetting& s) {
  const int64_t V = vocab_of(s);
  auto range = [](int64_t lo, int64_t hi) {
    std::vector<int64_t> r(static_cast<size_t>(hi - lo));
    std::iota(r.begin(), r.end(), lo);
    return r;
  };
  if (s.task == "mqar") return range(V / 2, V);
  if (s.task == "in_context_recall") return range((V - 1) / 2, V - 1);
  if (s.task == "noisy_recall") return range((V - 1 - kNoisyNoiseVocab) / 2, V - 1 - kNoisyNoiseVocab);
  if (s.task == "fuzzy_recall") return range((V - 2) / 2, V - 2);
  if (s.task == "selective_copy") return range(0, V - 2);
  if (s.task == "compression") return range(0, V - 1);
  if (s.task == "memorization") return range((V - 1) / 2, 2 * ((V - 1) / 2));
  if (s.task == "s3" || s.task == "s5") return range(128, 128 + (s.task == "s3" ? 6 : 120));
  if (s.task == "parity") return {2, 3};
  task_info(s.task);
  return {};
}

double task_chance(const TaskSetting& s) { return 1.0 / double(task_answer_alphabet(s).size()); }

namespace {
// Tokens of an instance at `length` (the generators' own size rules).
int64_t instance_tokens(const TaskSetting& s, int64_t length) {
  if (s.task == "s3" || s.task == "s5") return 4 + 2 * length;  // "s3:" g p … "\n"
  if (s.task == "parity") return 2 * length;
  if (s.task == "in_context_recall" || s.task == "noisy_recall" || s.task == "fuzzy_recall") return length + 1;
  return length;
}
}  // namespace

int64_t task_model_seq_len(const TaskSetting& s) {
  int64_t n = instance_tokens(s, s.length);
  for (int64_t t : s.test_lengths) n = std::max(n, instance_tokens(s, t));
  return n + 1;  // BOS
}

void check_task_setting(const TaskSetting& s) {
  task_info(s.task);
  const int64_t V = vocab_of(s);
  auto bad = [&](const std::string& why) { throw InputError(fmt::format("task setting '{}': {}", s.label(), why)); };
  if (s.d_model < 24) bad("d_model must be at least 24");
  std::vector<int64_t> lens = s.test_lengths;
  lens.push_back(s.length);
  for (int64_t L : lens) {
    if (L < 1) bad(fmt::format("length {} is not positive", L));
    if (s.task == "mqar") {
      if (s.pairs < 1) bad("mqar needs pairs >= 1");
      if (L % 2 != 0) bad(fmt::format("mqar's length {} must be even", L));
      if (4 * s.pairs > L) bad(fmt::format("4 x pairs ({}) exceeds the length {}", 4 * s.pairs, L));
      if (V / 2 - 1 < s.pairs) bad(fmt::format("vocab {} has fewer than {} keys", V, s.pairs));
    } else if (s.task == "in_context_recall" || s.task == "noisy_recall") {
      if (L % 2 != 0 || L < 4) bad(fmt::format("length {} must be even and at least 4", L));
      if (V - 1 - (s.task == "noisy_recall" ? kNoisyNoiseVocab : 0) < 4) bad(fmt::format("vocab {} is too small", V));
    } else if (s.task == "fuzzy_recall") {
      if (L < 32) bad(fmt::format("fuzzy recall needs a length of at least 32, not {}", L));
      if ((V - 2) / 2 < kMotifMax) bad(fmt::format("vocab {} is too small for 3-token motifs", V));
    } else if (s.task == "selective_copy") {
      if (L <= 2 * copy_count(L) + 1) bad(fmt::format("length {} is too short", L));
      if (V < 4) bad(fmt::format("vocab {} is too small", V));
    } else if (s.task == "compression") {
      if (compression_n(L) < 1) bad(fmt::format("length {} is below 4", L));
      if (V < 3) bad(fmt::format("vocab {} is too small", V));
    } else if (s.task == "memorization") {
      if (L % 2 != 0) bad(fmt::format("length {} must be even", L));
      if (V < 5) bad(fmt::format("vocab {} is too small", V));
    } else if (s.pairs != 0) {
      bad("pairs applies to mqar only");
    }
  }
  if (s.pairs != 0 && s.task != "mqar") bad("pairs applies to mqar only");
}

// ------------------------------------------------------------------ generators
ProbeSeq task_mqar(uint64_t seed, int64_t length, int64_t pairs, int64_t V) {
  Draw r(seed);
  const std::vector<int64_t> keys = r.distinct(1, V / 2, pairs), vals = r.distinct(V / 2, V, pairs);
  ProbeSeq s;
  for (int64_t i = 0; i < pairs; ++i) {
    s.tokens.push_back(keys[size_t(i)]);
    s.tokens.push_back(vals[size_t(i)]);
  }
  // gaps without replacement under the power law (sequential weighted draws)
  const int64_t space = (length - 2 * pairs) / 2;
  std::vector<double> w(static_cast<size_t>(space));
  for (int64_t g = 0; g < space; ++g) w[size_t(g)] = kPowerA * std::pow(double(g + 1), kPowerA - 1);
  std::vector<int64_t> query_at(static_cast<size_t>(space), -1);  // gap -> pair index
  for (int64_t i = 0; i < pairs; ++i) {
    const double total = std::accumulate(w.begin(), w.end(), 0.0);
    double u = r.unit() * total;
    int64_t g = 0;
    while (g + 1 < space && (u -= w[size_t(g)]) >= 0) ++g;
    while (w[size_t(g)] == 0) --g;  // rounding at the end of the scan
    query_at[size_t(g)] = i;
    w[size_t(g)] = 0;
  }
  for (int64_t t = 2 * pairs; t < length; ++t) {
    const int64_t off = t - 2 * pairs;
    const int64_t q = off / 2 < space ? query_at[size_t(off / 2)] : -1;
    if (q >= 0 && off % 2 == 0) s.tokens.push_back(keys[size_t(q)]);
    else if (q >= 0) answer(s, vals[size_t(q)]);
    else s.tokens.push_back(r.below(V));  // Zoology's random_non_queries
  }
  return s;
}

ProbeSeq task_recall(uint64_t seed, int64_t length, int64_t V, int64_t noise_vocab, double frac_noise) {
  Draw r(seed);
  const int64_t copy = V - 1, ns = V - 1 - noise_vocab, K = ns / 2;
  const int64_t n_pairs = length / 2;
  const int64_t kept = r.below(n_pairs - 1);  // at least one real pair before the probe
  std::map<int64_t, int64_t> kv;
  std::vector<int64_t> presented;
  ProbeSeq s;
  for (int64_t i = 0; i + 1 < n_pairs; ++i) {
    if (i != kept && frac_noise > 0 && r.unit() < frac_noise) {
      s.tokens.push_back(ns + r.below(noise_vocab));
      s.tokens.push_back(ns + r.below(noise_vocab));
      continue;
    }
    const int64_t k = r.below(K);
    auto it = kv.find(k);
    s.tokens.push_back(k);
    if (it != kv.end()) {
      answer(s, it->second);
    } else {
      kv[k] = K + r.below(ns - K);
      presented.push_back(k);
      s.tokens.push_back(kv[k]);
    }
  }
  const int64_t k = presented[size_t(r.below(int64_t(presented.size())))];
  s.tokens.push_back(copy);
  s.tokens.push_back(k);
  answer(s, kv[k]);
  return s;
}

ProbeSeq task_fuzzy_recall(uint64_t seed, int64_t length, int64_t V, bool held_out) {
  Draw r(seed);
  const int64_t copy = V - 1, pad = V - 2, ns = V - 2, K = ns / 2;
  auto key_size = [&] { return held_out ? kMotifMax : 1 + r.below(kMotifMax); };
  auto motif = [&](int64_t lo, int64_t hi, int64_t n) { return r.distinct(lo, hi, n); };
  const std::vector<int64_t> kp = motif(0, K, key_size()), vp = motif(K, ns, 1 + r.below(kMotifMax));
  const int64_t room = length + 1 - 1 - int64_t(kp.size() + vp.size());  // body tokens
  const int64_t limit = room - 4 * kMotifMax;  // a pair may start below it; the probe pair still fits
  const int64_t probe_at = r.below(std::max<int64_t>(1, limit));
  std::map<std::vector<int64_t>, std::vector<int64_t>> kv;
  ProbeSeq body;
  auto put = [&](const std::vector<int64_t>& k, const std::vector<int64_t>& v) {
    const bool seen = kv.count(k) > 0;
    kv[k] = v;
    body.tokens.insert(body.tokens.end(), k.begin(), k.end());
    for (int64_t t : v) seen ? answer(body, t) : body.tokens.push_back(t);
  };
  bool probe_added = false;
  while (int64_t(body.tokens.size()) < limit) {
    if (!probe_added && int64_t(body.tokens.size()) >= probe_at) {
      put(kp, vp);
      probe_added = true;
      continue;
    }
    const std::vector<int64_t> k = motif(0, K, key_size());
    auto it = kv.find(k);
    put(k, k == kp ? vp : it != kv.end() ? it->second : motif(K, ns, 1 + r.below(kMotifMax)));
  }
  if (!probe_added) put(kp, vp);
  ProbeSeq s;
  s.tokens.assign(size_t(length + 1 - int64_t(body.tokens.size() + 1 + kp.size() + vp.size())), pad);
  const int64_t shift = int64_t(s.tokens.size());
  s.tokens.insert(s.tokens.end(), body.tokens.begin(), body.tokens.end());
  for (int64_t p : body.answer_pos) s.answer_pos.push_back(p + shift);
  s.tokens.push_back(copy);
  s.tokens.insert(s.tokens.end(), kp.begin(), kp.end());
  for (int64_t t : vp) answer(s, t);
  return s;
}

ProbeSeq task_selective_copy(uint64_t seed, int64_t length, int64_t n_copy, int64_t V) {
  Draw r(seed);
  const int64_t copy = V - 1, blank = V - 2;
  const int64_t body = length - n_copy - 1;
  std::vector<int64_t> where = r.distinct(0, body, n_copy);
  std::sort(where.begin(), where.end());
  std::vector<int64_t> items;
  ProbeSeq s;
  s.tokens.assign(size_t(body), blank);
  for (int64_t p : where) {
    items.push_back(r.below(V - 2));
    s.tokens[size_t(p)] = items.back();
  }
  s.tokens.push_back(copy);
  for (int64_t t : items) answer(s, t);
  return s;
}

ProbeSeq task_compression(uint64_t seed, int64_t length, int64_t content) {
  Draw r(seed);
  const int64_t n = compression_n(length);
  ProbeSeq s;
  for (int64_t i = 0; i < n; ++i) s.tokens.push_back(r.below(content));
  s.tokens.push_back(content);
  for (int64_t i : r.distinct(0, n, n)) {
    s.tokens.push_back(content + 1 + i);
    answer(s, s.tokens[size_t(i)]);
  }
  return s;
}

ProbeSeq task_memorization(uint64_t seed, int64_t length, int64_t V) {
  const int64_t K = (V - 1) / 2;
  static std::map<int64_t, std::vector<int64_t>> maps;  // per vocabulary; filled once
  static std::mutex mu;
  std::vector<int64_t> values;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto& m = maps[V];
    if (m.empty()) m = Draw(kMemorizationSeed).distinct(K, 2 * K, K);
    values = m;
  }
  Draw r(seed);
  ProbeSeq s;
  for (int64_t i = 0; i < length / 2; ++i) {
    const int64_t k = r.below(K);
    s.tokens.push_back(k);
    answer(s, values[size_t(k)]);
  }
  return s;
}

ProbeSeq task_parity(uint64_t seed, int64_t steps) {
  Draw r(seed);
  ProbeSeq s;
  int64_t parity = 0;
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t b = r.below(2);
    parity ^= b;
    s.tokens.push_back(b);
    answer(s, 2 + parity);
  }
  return s;
}

uint64_t tokens_hash(const std::vector<int64_t>& tokens) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t t : tokens)
    for (int b = 0; b < 8; ++b) h = (h ^ ((uint64_t(t) >> (8 * b)) & 0xff)) * 0x100000001b3ull;
  return splitmix64(h);  // FNV-1a's low bit is only the parity of the odd bytes: mix every bit into it
}

ProbeSeq task_instance(const TaskSetting& s, uint64_t seed, TaskSplit split, int64_t index, int64_t length) {
  const int64_t V = vocab_of(s);
  // the held-out stream has its own seed (the probes' held-out seed), and the hash bit keeps the
  // two sets disjoint even where the streams could draw the same instance
  const uint64_t stream = split == TaskSplit::HeldOut ? probe_eval_seed(seed) : seed;
  const uint64_t base = splitmix64(stream ^ name_salt(s.task)) ^ splitmix64(uint64_t(index) ^ (uint64_t(length) << 40));
  const uint64_t want = split == TaskSplit::HeldOut ? 1 : 0;
  for (uint64_t attempt = 0; attempt < 256; ++attempt) {
    const uint64_t is = splitmix64(base + attempt);
    ProbeSeq q;
    if (s.task == "mqar") q = task_mqar(is, length, s.pairs, V);
    else if (s.task == "in_context_recall") q = task_recall(is, length, V, 0, 0.0);
    else if (s.task == "noisy_recall") q = task_recall(is, length, V, kNoisyNoiseVocab, kNoisyFraction);
    else if (s.task == "fuzzy_recall") q = task_fuzzy_recall(is, length, V, split == TaskSplit::HeldOut);
    else if (s.task == "selective_copy") q = task_selective_copy(is, length, copy_count(length), V);
    else if (s.task == "compression") q = task_compression(is, length, V - 1);
    else if (s.task == "memorization") q = task_memorization(is, length, V);
    else if (s.task == "s3" || s.task == "s5") q = probe_perm(s.task == "s3" ? 3 : 5, is, 0, length);
    else if (s.task == "parity") q = task_parity(is, length);
    else task_info(s.task);
    if ((tokens_hash(q.tokens) & 1) == want) return q;
  }
  throw InputError(fmt::format("task setting '{}' has too few distinct instances to hold out", s.label(length)));
}

}  // namespace mixbench
