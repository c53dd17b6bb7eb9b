// Evaluation beside the training loss: capability probes (multi-query associative recall,
// needle-in-a-haystack retrieval, permutation state tracking) as byte sequences with their answer
// positions, and their greedy-argmax scoring. (The leaderboard's HTML page: reports/leaderboard.h.)
#pragma once
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mixbench {

// SplitMix64's finaliser: the seed mixer of the synthetic data and the probes.
uint64_t splitmix64(uint64_t x);

// One probe sequence of byte tokens (no BOS). answer_pos lists the positions p whose token is an
// answer: the model is scored on predicting tokens[p] from the prefix tokens[0..p−1].
struct ProbeSeq {
  std::vector<int64_t> tokens;
  std::vector<int64_t> answer_pos;
};

// Multi-query associative recall (Zoology's MQAR): "mqar:" k1 v1 … kn vn "?" q1 a1 … qn an "\n",
// keys distinct capitals A–Z, values lower-case a–z, the queries every key once in a shuffled
// order; the answers are the values a_i. 1 ≤ n_pairs ≤ 26.
ProbeSeq probe_mqar(uint64_t seed, int64_t index, int64_t n_pairs);
// Needle in a haystack in the style of RULER's NIAH single-1/2/3: filler (1: one repeated
// sentence; 2 and 3: words drawn from a word list) with " key K is V." hidden at a random sentence
// boundary, then " what is K? V\n"; K three lower-case letters, V four digits (1, 2) or six hex
// digits (3). The answers are V's bytes in the query. `length` is the total size in bytes (≥ 48).
ProbeSeq probe_niah(int variant, uint64_t seed, int64_t index, int64_t length);
// Permutation state tracking (the word problem of S_n, n = 3 or 5): "s<n>:" g1 p1 g2 p2 … gk pk
// "\n" where each element is one byte 128 + (its rank among the permutations of {0..n−1} in
// lexicographic order, i.e. std::next_permutation's order) and p_i = p_{i−1} ∘ g_i, that is
// p_i(x) = p_{i−1}(g_i(x)), p_0 = identity. The answers are the p_i.
ProbeSeq probe_perm(int n, uint64_t seed, int64_t index, int64_t steps);

// The probes that fit a training length T (a sequence plus its BOS within T tokens), each with its
// generator at sizes derived from T. Names: mqar, niah_single_1/2/3, perm_s3, perm_s5.
struct ProbeSpec {
  std::string name;
  double chance = 0;  // accuracy of uniform guessing among the answer alphabet
  std::function<ProbeSeq(uint64_t seed, int64_t index)> make;
};
std::vector<ProbeSpec> probe_suite(int64_t T);

// Logits [B, L, V] for token ids [B, L] (a model's forward).
using LogitsFn = std::function<at::Tensor(const at::Tensor& idx)>;
struct ProbeScore {
  double accuracy = 0;  // correct answer tokens / answer tokens
  double exact = 0;     // sequences with every answer correct / sequences
  int64_t sequences = 0, answers = 0;
};
// Prefixes every sequence with `bos`, pads on the right with `bos` into batches of `batch` rows,
// takes the greedy argmax of the logits at p−1 for each answer position p (shifted by the BOS).
ProbeScore score_probes(const std::vector<ProbeSeq>& seqs, const LogitsFn& logits, int64_t bos, int64_t batch = 32);

// Held-out probe sequences (a seed stream apart from the training stream's) scored with `logits`;
// JSON {name: {accuracy, exact, chance, sequences, answers}}.
nlohmann::json evaluate_probes(const LogitsFn& logits, int64_t T, uint64_t seed, int64_t n_per_probe, int64_t bos);
// Seed of the held-out probe stream for a run seed (the training stream uses the run seed).
uint64_t probe_eval_seed(uint64_t seed);

}  // namespace mixbench
