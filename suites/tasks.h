// The synthetic task suite (`mixbench tasks`), Zoology's and MAD-lab's protocol: a small model
// (2 layers) of each registered method trained directly on each task setting (suites/tasks_data.h)
// with a masked cross-entropy on the answer positions and plain AdamW, then scored (greedy argmax)
// on held-out instances. One result row per (method, setting, held-out length, seed).
#pragma once
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "harness/backbone.h"
#include "harness/registry.h"
#include "suites/tasks_data.h"

namespace mixbench {

// A preset: the grid, the default lineup and the training budget per setting.
struct TasksPreset {
  std::string name;
  std::string about;
  std::vector<std::string> lineup;  // default methods; empty = every registered method
  std::vector<std::string> tasks;   // default tasks
  // The defaults are the gpu preset's.
  int64_t seeds = 3;
  int64_t steps = 1000, batch = 64;  // AdamW steps and instances per step, per setting
  double lr = 1e-3, weight_decay = 0.1;  // AdamW (β 0.9, 0.999); decay on matrices only
  int64_t n_layer = 2, head_dim = 32;
  int64_t eval_instances = 1000;    // held-out instances per held-out length
  int cpu_threads = 0;              // intra-op threads on the CPU (0 = LibTorch's default)
  // MQAR grid (Zoology's figure 2): every (length, pairs) with 4·pairs <= length, at every width
  std::vector<int64_t> mqar_lengths = {64, 128, 256, 512}, mqar_pairs = {4, 8, 16, 32, 64}, mqar_widths = {64, 128, 256};
  int64_t mqar_vocab = 8192;
  int64_t mad_length = 128, mad_width = 128;  // MAD's tasks (selective copy: 2 x mad_length, as MAD's 256)
  int64_t state_length = 16, state_width = 128;  // s3/s5/parity: trained at L, held out at L, 2L, 4L
  // Held-out lengths as multiples of each setting's training length (length extrapolation, e.g.
  // {1, 2, 4, 8}); empty = the task's own rule (L; L, 2L, 4L for state tracking).
  std::vector<int64_t> test_scales;
  // Config overrides "k=v,..." of every method's model, after the method's tiny-preset overrides.
  std::string config;
};
// "cpu-tiny" or "gpu"; UsageError otherwise.
TasksPreset tasks_preset(const std::string& name);

// The settings of `tasks` (empty = the preset's) on the preset's grid; UsageError for an unknown task.
std::vector<TaskSetting> task_grid(const TasksPreset& p, const std::vector<std::string>& tasks);

// The config of `method`'s model for a setting: n_layer, d_model, head_dim, seq_len (the longest
// instance + BOS), vocab (the task's + BOS), then the method's tiny-preset overrides, then p.config.
std::string task_model_config(const MethodSpec& method, const TasksPreset& p, const TaskSetting& s);

// Instances as model rows: idx [N, T] with BOS first and BOS padding on the right, targets [N, T]
// holding tokens[p] at column p for each answer position p and −1 (ignored) elsewhere.
void task_batch(const std::vector<ProbeSeq>& seqs, int64_t T, int64_t bos, at::Tensor& idx, at::Tensor& targets);

// One run's training, as run_tasks trains every run: the model of `method` at `cfg` initialised
// from `seed` on the CPU (fp32) and moved to `device`, then `steps` AdamW steps (P.lr with a linear
// warm-up over the first 10% of the steps and a warm-down over the last 20%, P.weight_decay on
// matrices) of P.batch training instances of the setting each (instance it·batch + b at step it),
// the loss the masked cross-entropy on the answer positions. On a GPU with graph "auto" the whole
// step (forward, loss, backward and the AdamW update, its learning rate and bias corrections read
// from a device buffer the host writes before each replay) is captured in a CUDA graph after the
// first step and replayed, the batches copied into its static input and target buffers; steps the
// graph cannot replay (a capture that fails, layers that depend on the step) run eagerly, and
// graph_reason says why. "off" runs every step eagerly. The CPU runs eager steps with host values.
struct TaskTraining {
  Model model;                 // trained, on `device`
  std::vector<double> losses;  // the masked loss at each step (read back once at the end on a GPU)
  bool graph = false;          // the steps after the capture replayed a graph of the whole step
  std::string graph_reason;    // why no graph held the steps (empty when `graph`)
  double seconds = 0;          // the training loop, up to a synchronised device
  // Steps per second after the first step (and after the capture step): the steady rate; over
  // every step when none follows those.
  double steps_per_s = 0;
};
TaskTraining train_task(const MethodSpec& method, const Config& cfg, const TaskSetting& s, const TasksPreset& P,
                        uint64_t seed, int64_t steps, const std::string& device, const std::string& graph = "auto");

struct TasksOptions {
  std::string preset = "cpu-tiny";
  std::vector<std::string> methods;  // empty = the preset's lineup; {"all"} = every registered method
  std::vector<std::string> tasks;    // empty = the preset's
  int64_t seeds = 0;                 // 0 = the preset's
  int64_t steps = 0;                 // 0 = the preset's
  double lr = 0;                     // AdamW peak learning rate; 0 = the preset's
  uint64_t seed = 0;                 // base seed; run k uses seed + k
  // MQAR grid overrides (empty = the preset's); every value must be positive
  std::vector<int64_t> mqar_lengths, mqar_pairs, mqar_widths;
  int64_t mqar_vocab = 0;            // MQAR token ids (0 = the preset's): keys [1, V/2), values [V/2, V)
  std::vector<int64_t> test_scales;  // TasksPreset::test_scales (empty = the preset's)
  std::string config;                // TasksPreset::config
  std::string device = "cpu";
  std::string graph = "auto";        // CUDA graphs of the training step on a GPU: "auto" or "off" (train_task)
  int progress = 0;                  // 0 none, 1 JSON lines, 2 human lines
};

// Rows {status, method, task, setting, seed, accuracy, chance, steps, seconds, steps_per_s,
// cuda_graph, cuda_graph_reason, ...}: status "ok", "skipped" (the method refuses the setting's
// config; `reason` says why) or "error" (`message`). UsageError for a bad option.
nlohmann::json run_tasks(const TasksOptions& o);
// The methods a run covers (UsageError for unknown ones).
std::vector<std::string> tasks_methods(const TasksPreset& p, const std::vector<std::string>& methods);

}  // namespace mixbench
