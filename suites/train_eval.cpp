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
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

namespace {

struct Rng {
  std::mt19937_64 g;
  Rng(uint64_t seed, uint64_t salt, int64_t index) : g(splitmix64(splitmix64(seed ^ salt) ^ uint64_t(index))) {}
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

uint64_t probe_eval_seed(uint64_t seed) { return splitmix64(seed ^ 0x484F4C444F5554ull); }

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

}  // namespace mixbench
