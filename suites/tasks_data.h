// The synthetic task suite's instances (Zoology's MQAR, MAD-lab's six tasks, state tracking):
// each instance is a token sequence with its answer positions (suites/train_eval.h's ProbeSeq:
// the model is trained and scored only on predicting tokens[p] for p in answer_pos). Every task
// uses token ids 0..vocab−1; the models add one id, `vocab`, as BOS and padding.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "suites/train_eval.h"

namespace mixbench {

// One point of a task's grid: the task, its sizes and the model width it is trained at.
struct TaskSetting {
  std::string task;
  int64_t length = 0;   // training instance size: tokens, or for s3/s5/parity the group elements L
  int64_t pairs = 0;    // mqar: key-value pairs (0 for the other tasks)
  int64_t d_model = 0;  // width of the model trained on it
  int64_t vocab = 0;    // token ids of the task; 0 = its default (mqar 8192 as Zoology, MAD's otherwise)
  std::vector<int64_t> test_lengths;  // held-out sizes (s3/s5/parity: L, 2L, 4L; else `length`)
  // "mqar pairs=4 len=64 d=64" (the held-out length appended when it differs from `length`)
  std::string label(int64_t test_length = 0) const;
  nlohmann::json to_json(int64_t test_length) const;  // {task, length, [pairs], d_model, test_length}
};

// A task: its name, a one-line description, and whether it is held out at longer lengths.
struct TaskInfo {
  std::string name;
  std::string summary;
  bool length_generalisation = false;  // held out at L, 2L, 4L
};
const std::vector<TaskInfo>& task_infos();
// UsageError naming the known tasks.
const TaskInfo& task_info(const std::string& name);

// Token ids the setting's instances use (BOS excluded; compression adds its position tokens), and
// the chance accuracy of guessing uniformly among the tokens its answers can take.
int64_t task_vocab(const TaskSetting& s);
double task_chance(const TaskSetting& s);
// The tokens an answer of the task can take (ascending): chance is 1 / their count.
std::vector<int64_t> task_answer_alphabet(const TaskSetting& s);
// Model sequence length that holds every instance of the setting (training and held-out) plus BOS.
int64_t task_model_seq_len(const TaskSetting& s);
// InputError when the setting's sizes are invalid for its task (e.g. 4·pairs > length).
void check_task_setting(const TaskSetting& s);

// Which stream an instance comes from: training draws from `seed`, held-out from
// probe_eval_seed(seed). The two are disjoint by construction: an instance belongs to the split its
// token hash's low bit names (candidates of the other split are redrawn).
enum class TaskSplit { Train, HeldOut };
// Instance `index` of the setting's stream for `seed` at size `length` (a test length or the
// training length). Deterministic in (setting, seed, split, index, length).
ProbeSeq task_instance(const TaskSetting& s, uint64_t seed, TaskSplit split, int64_t index, int64_t length);
// 64-bit FNV-1a of the tokens' bytes, finalised by SplitMix64 (the split rule above).
uint64_t tokens_hash(const std::vector<int64_t>& tokens);

// The generators (one per task), exposed for the tests; `r` draws are a function of `seed`.
// Zoology's MQAR: k1 v1 … kn vn (keys distinct from [1, V/2), values distinct from [V/2, V)), then
// the query region of length − 2n random tokens where each key sits at an even offset 2·gap
// (gaps without replacement, P(gap = g) ∝ a·(g+1)^(a−1), a = 0.01) followed by its value (the answer).
ProbeSeq task_mqar(uint64_t seed, int64_t length, int64_t pairs, int64_t vocab);
// MAD's in-context recall (noise_vocab = 0, frac_noise = 0) and noisy in-context recall: key-value
// pairs (keys [0, K), values [K, 2K), K = (vocab − 1 − noise_vocab)/2, each key's value fixed
// within the instance), noise pairs from the noise tokens with probability frac_noise, then the
// copy prefix (vocab − 1), a presented key and its value. Answers: every value whose key was
// presented before, and the final value. length + 1 tokens.
ProbeSeq task_recall(uint64_t seed, int64_t length, int64_t vocab, int64_t noise_vocab, double frac_noise);
// MAD's fuzzy in-context recall: keys and values are motifs of 1..3 distinct tokens (keys from
// [0, K), values from [K, 2K), K = (vocab − 2)/2); held-out instances use 3-token keys only. The
// sequence is left-padded with vocab − 2 to length + 1 tokens and ends with the copy prefix
// (vocab − 1), the probed key and its value. Answers: the value tokens of keys presented before.
ProbeSeq task_fuzzy_recall(uint64_t seed, int64_t length, int64_t vocab, bool held_out);
// MAD's selective copying: `n_copy` tokens from [0, vocab − 2) scattered among blanks (vocab − 2),
// the copy token (vocab − 1), then the tokens again in order (the answers). `length` tokens.
ProbeSeq task_selective_copy(uint64_t seed, int64_t length, int64_t n_copy, int64_t vocab);
// Compression, in a causal model's form: n = (length − 1)/3 tokens x_i from [0, content),
// the compression token `content`, then every position token content + 1 + i (i < n, shuffled)
// followed by x_i (the answer): the model must keep the whole sequence, addressed by position.
ProbeSeq task_compression(uint64_t seed, int64_t length, int64_t content);
// MAD's memorization: key, value pairs from one fixed key→value map (keys [0, K), values
// [K, 2K), K = (vocab − 1)/2, drawn once from a fixed seed for every run); the values are the
// answers (MAD puts an insert token in the value's place and the value as its target).
ProbeSeq task_memorization(uint64_t seed, int64_t length, int64_t vocab);
// Parity: b1 q1 b2 q2 … bL qL with bits b_i ∈ {0, 1} and q_i = 2 + (b1 ⊕ … ⊕ b_i) the answers.
ProbeSeq task_parity(uint64_t seed, int64_t steps);

}  // namespace mixbench
