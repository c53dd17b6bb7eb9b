// Data-parallel training over c10d: one process per device (Gloo on CPUs, NCCL on GPUs), rendezvous
// from torchrun's variables or from `--nproc N` (mixbench starts the N local processes itself), the
// step's rows shared out by rank, gradients summed in buckets while the backward runs.
//
// Every rank runs the same optimizer update on the summed gradients (Muon included): the update is
// replicated, not sharded. At d12 Muon is a small share of a step, so replicating it costs little and
// keeps the optimizer identical to the one-process run; nanochat shards Muon across ranks to save its
// memory and compute at larger scale.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/backbone.h"

namespace mixbench {

// torchrun's variables: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK.
struct DistEnv {
  int rank = 0, world = 1, local_rank = 0;
  std::string master_addr;
  int master_port = 0;
};
// World 1 when none is set or WORLD_SIZE=1 (the one-process run). UsageError when some are set and
// others missing, a value is not a number, or RANK >= WORLD_SIZE. LOCAL_RANK defaults to RANK.
DistEnv dist_env_from_environment();

// A collective failed or timed out: another rank died, hung or failed. The message names the rank
// where it can tell.
struct PeerFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The rows [first, first + rows) of a step's batch that one rank trains on.
struct RowShare {
  int64_t first = 0, rows = 0;
};

class GradientReducer;

// One process group over all ranks. Every collective and store operation has the timeout given to
// connect(); a rank that fails writes its message to the store, so the others can name it.
class DataParallel {
 public:
  // Rendezvous over a TCPStore at MASTER_ADDR:MASTER_PORT (hosted by rank 0); every rank checks that the
  // others have its WORLD_SIZE; then the process group: NCCL on GPU LOCAL_RANK for device "cuda", Gloo on
  // the CPU. UsageError for an unreachable store, inconsistent WORLD_SIZE, a rank that does not join
  // within the timeout, or LOCAL_RANK beyond the visible GPUs.
  static std::shared_ptr<DataParallel> connect(const DistEnv& env, const std::string& device,
                                               std::chrono::seconds timeout);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const;
  int world() const;
  int local_rank() const;
  const std::string& backend() const;  // "gloo" or "nccl"

  // This rank's contiguous share of a step's `batch` rows (UsageError unless the world divides it).
  RowShare share(int64_t batch) const;
  // v[from:] summed element-wise over the ranks, in place (doubles; every rank calls it).
  void sum(std::vector<double>& v, size_t from = 0);
  // Rank 0's value, on every rank.
  int64_t from_rank0(int64_t value);
  void barrier();
  // Marks the start of step `step` on this rank (a heartbeat in the store, as is reaching the step's
  // gradient all-reduce: the failure messages name the ranks whose heartbeat is behind). With
  // MIXBENCH_TEST_DIE_AT_STEP=k (tests only) the last rank kills itself as step k starts; with
  // MIXBENCH_TEST_HANG_AT_STEP=k it stops inside step k; with MIXBENCH_TEST_FAIL_AT_STEP=k it throws.
  void step_begins(int64_t step);
  // Records this rank's failure in the store (best effort) before the process exits.
  void report_failure(const std::string& message);
  // Gradient buckets of ~bucket_bytes over the model's parameters, reduced while the backward runs.
  std::unique_ptr<GradientReducer> reducer(const Model& m, size_t bucket_bytes = size_t(25) << 20);

  struct Impl;

 private:
  explicit DataParallel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class GradientReducer;
};

// Sums the parameters' gradients over the ranks. The parameters are grouped into buckets in reverse
// order (the order the backward finishes them); during an armed backward each bucket's all-reduce is
// launched as soon as all of its gradients are accumulated, in bucket order on every rank.
class GradientReducer {
 public:
  GradientReducer(DataParallel& dp, const Model& m, size_t bucket_bytes);
  ~GradientReducer();
  // Arms (or disarms) the hooks for the next backward: armed for the step's last micro-batch on this rank.
  void arm(bool on);
  // Waits for the all-reduces (launching those of buckets whose gradients never came, as zeros) and
  // writes the sums into the parameters' .grad. PeerFailure when a rank failed.
  void finish();
  size_t buckets() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;  // the hooks hold it weakly
};

// Starts `nproc` copies of this executable with `args` and torchrun's variables set (MASTER_ADDR
// 127.0.0.1, a free port, RANK = LOCAL_RANK = i, WORLD_SIZE = nproc) and waits for them. When one fails,
// the others are stopped and the error names the rank; returns the first failing rank's exit code
// (0 when all succeed). UsageError for nproc < 1 or, with device "cuda", more than the visible GPUs.
int spawn_local_ranks(int nproc, const std::string& device, const std::vector<std::string>& args);

}  // namespace mixbench
