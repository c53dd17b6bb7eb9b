#include "suites/distributed.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef MIXBENCH_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>

#include "harness/errors.h"

namespace mixbench {

namespace {

std::optional<std::string> env_var(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

int env_int(const char* name, const std::string& text, int lo, int hi) {
  size_t used = 0;
  long v = -1;
  try {
    v = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || v < lo || v > hi)
    throw UsageError(fmt::format("{}='{}' must be an integer in [{}, {}]", name, text, lo, hi));
  return int(v);
}

// c10's errors carry a backtrace in what(); the message alone reads better.
std::string message_of(const std::exception& e) {
  if (auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string text(const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); }

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

}  // namespace

DistEnv dist_env_from_environment() {
  const auto world = env_var("WORLD_SIZE"), rank = env_var("RANK"), addr = env_var("MASTER_ADDR"),
             port = env_var("MASTER_PORT"), local = env_var("LOCAL_RANK");
  DistEnv e;
  if (!world && !rank && !addr && !port) return e;
  if (world && env_int("WORLD_SIZE", *world, 1, 1 << 20) == 1) {
    if (rank && env_int("RANK", *rank, 0, 1 << 20) != 0)
      throw UsageError(fmt::format("RANK {} must be < WORLD_SIZE 1", *rank));
    return e;  // one process: no rendezvous
  }
  std::string missing;
  for (const auto& [name, v] : {std::pair<const char*, const std::optional<std::string>&>{"MASTER_ADDR", addr},
                                {"MASTER_PORT", port},
                                {"RANK", rank},
                                {"WORLD_SIZE", world}})
    if (!v) missing += (missing.empty() ? "" : ", ") + std::string(name);
  if (!missing.empty())
    throw UsageError(fmt::format("torchrun's variables are partly set: {} missing (set MASTER_ADDR, MASTER_PORT, "
                                 "RANK and WORLD_SIZE, or none of them)",
                                 missing));
  e.world = env_int("WORLD_SIZE", *world, 1, 1 << 20);
  e.rank = env_int("RANK", *rank, 0, 1 << 20);
  if (e.rank >= e.world) throw UsageError(fmt::format("RANK {} must be < WORLD_SIZE {}", e.rank, e.world));
  e.local_rank = local ? env_int("LOCAL_RANK", *local, 0, 1 << 20) : e.rank;
  e.master_addr = *addr;
  e.master_port = env_int("MASTER_PORT", *port, 1, 65535);
  return e;
}

// ------------------------------------------------------------------ the process group
struct DataParallel::Impl {
  DistEnv env;
  std::string backend;
  std::chrono::milliseconds timeout{0};
  c10::intrusive_ptr<c10d::Store> store;  // keys under "mixbench/"
  c10::intrusive_ptr<c10d::Backend> pg;
  at::Device device = at::Device(at::kCPU);
  int64_t step = -1;
  int64_t beat = -1;  // 2·step when the step started, 2·step + 1 when it reached its gradient all-reduce
  int64_t broadcasts = 0;  // from_rank0 calls so far (each uses its own key)

  // Publishes this rank's heartbeat (the store's key "mixbench/beat/RANK").
  void heartbeat(int64_t b) {
    beat = b;
    try {
      store->set(key("beat", env.rank), bytes(std::to_string(b)));
    } catch (const std::exception& e) {
      throw failure("the heartbeat", message_of(e));
    }
  }

  std::string key(const std::string& k, int r) const { return fmt::format("mixbench/{}/{}", k, r); }

  // The failure of a collective (`what`), naming the rank responsible where the store can tell: a rank
  // that recorded its failure, else ranks whose heartbeat is behind this rank's; where the store is
  // gone, rank 0 (its host).
  PeerFailure failure(const std::string& what, const std::string& cause) {
    std::string who;
    try {
      store->setTimeout(std::chrono::milliseconds(2000));
      for (int k = 0; k < env.world; ++k)
        if (k != env.rank && store->check({key("failed", k)}))
          who += fmt::format("; rank {} failed: {}", k, text(store->get(key("failed", k))));
      if (who.empty())
        for (int k = 0; k < env.world; ++k) {
          if (k == env.rank) continue;
          const int64_t hb = store->check({key("beat", k)}) ? std::stoll(text(store->get(key("beat", k)))) : -1;
          if (hb >= beat) continue;
          who += fmt::format("; rank {} stopped responding {} (it died or hung)", k,
                             hb < 0         ? std::string("before its first step")
                             : hb % 2 == 0 ? fmt::format("in step {}, before its gradient all-reduce", hb / 2 + 1)
                                           : fmt::format("after the gradient all-reduce of step {}", hb / 2 + 1));
        }
    } catch (const std::exception&) {
      if (env.rank != 0)
        who = fmt::format("; rank 0, which hosts the rendezvous store at {}:{}, is unreachable (it died?)",
                          env.master_addr, env.master_port);
    }
    return PeerFailure(fmt::format("rank {}: {} failed at step {}{}; {}", env.rank, what, step + 1, who, cause));
  }

  void wait(const c10::intrusive_ptr<c10d::Work>& w, const std::string& what) {
    try {
      w->wait();
    } catch (const std::exception& e) {
      throw failure(what, message_of(e));
    }
  }
};

DataParallel::DataParallel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DataParallel::~DataParallel() = default;
int DataParallel::rank() const { return impl_->env.rank; }
int DataParallel::world() const { return impl_->env.world; }
int DataParallel::local_rank() const { return impl_->env.local_rank; }
const std::string& DataParallel::backend() const { return impl_->backend; }

std::shared_ptr<DataParallel> DataParallel::connect(const DistEnv& env, const std::string& device,
                                                    std::chrono::seconds timeout) {
  if (env.world <= 1) return nullptr;
  auto impl = std::make_unique<Impl>();
  impl->env = env;
  impl->timeout = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  const std::string where = fmt::format("{}:{}", env.master_addr, env.master_port);
  if (device == "cuda") {
    const size_t gpus = at::getNumGPUs();
    if (size_t(env.local_rank) >= gpus)
      throw UsageError(fmt::format("rank {}: LOCAL_RANK {} but {} GPU(s) are visible", env.rank, env.local_rank, gpus));
  } else if (device != "cpu") {
    throw UsageError(fmt::format("unknown device '{}' (cpu or cuda)", device));
  }
  c10d::TCPStoreOptions so;
  so.port = uint16_t(env.master_port);
  // torchrun's agent already hosts a store at MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True): every rank
  // is its client; otherwise rank 0 hosts it.
  so.isServer = env.rank == 0 && env_var("TORCHELASTIC_USE_AGENT_STORE").value_or("") != "True";
  so.numWorkers = size_t(env.world);
  so.waitWorkers = false;
  so.timeout = impl->timeout;
  try {
    impl->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("rank {}: cannot {} the rendezvous store at {} within {} s (MASTER_ADDR, MASTER_PORT): {}",
                                 env.rank, env.rank == 0 ? "start or reach" : "reach", where, timeout.count(),
                                 message_of(e)));
  }
  // Every rank publishes its WORLD_SIZE; rank 0 checks everyone's, the others check rank 0's (read
  // before they publish theirs, so that rank 0 cannot have left over a mismatch it saw first).
  auto& st = *impl->store;
  auto world_of = [&](int k) {
    try {
      st.wait({impl->key("world_size", k)}, impl->timeout);
      return std::stoi(text(st.get(impl->key("world_size", k))));
    } catch (const std::exception& e) {
      throw UsageError(fmt::format("rank {}: rank {} did not join the rendezvous at {} within {} s: {}", env.rank, k,
                                   where, timeout.count(), message_of(e)));
    }
  };
  auto check = [&](int k, int w) {
    if (w != env.world)
      throw UsageError(fmt::format("WORLD_SIZE is {} on rank {} but {} on rank {}: every rank needs the same WORLD_SIZE",
                                   env.world, env.rank, w, k));
  };
  const int world0 = env.rank == 0 ? env.world : world_of(0);
  try {
    st.set(impl->key("world_size", env.rank), bytes(std::to_string(env.world)));
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("rank {}: the rendezvous store at {} failed: {}", env.rank, where, message_of(e)));
  }
  check(0, world0);
  if (env.rank == 0)
    for (int k = 1; k < env.world; ++k) check(k, world_of(k));
  auto pg_store = c10::make_intrusive<c10d::PrefixStore>("mixbench/pg", impl->store);
  try {
    if (device == "cuda") {
#ifdef MIXBENCH_WITH_CUDA
      c10::cuda::set_device(c10::DeviceIndex(env.local_rank));
      auto o = c10d::ProcessGroupNCCL::Options::create();
      o->timeout = impl->timeout;
      impl->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(pg_store, env.rank, env.world, o);
      impl->backend = "nccl";
      impl->device = at::Device(at::kCUDA, c10::DeviceIndex(env.local_rank));
#else
      throw UsageError("--device cuda: this build has no CUDA support");
#endif
    } else {
      auto o = c10d::ProcessGroupGloo::Options::create(impl->timeout);
      o->devices.push_back(is_loopback(env.master_addr) ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                                        : c10d::ProcessGroupGloo::createDefaultDevice());
      impl->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(pg_store, env.rank, env.world, o);
      impl->backend = "gloo";
    }
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("rank {}: the process group over {} ranks did not form within {} s: {}", env.rank,
                                 env.world, timeout.count(), message_of(e)));
  }
  return std::shared_ptr<DataParallel>(new DataParallel(std::move(impl)));
}

RowShare DataParallel::share(int64_t batch) const {
  const int64_t W = impl_->env.world;
  if (batch % W != 0)
    throw UsageError(fmt::format("the batch of {} rows cannot be shared out evenly over {} ranks (--batch must be a "
                                 "multiple of the world size)",
                                 batch, W));
  return {impl_->env.rank * (batch / W), batch / W};
}

void DataParallel::sum(std::vector<double>& v, size_t from) {
  if (from >= v.size()) return;
  const int64_t n = int64_t(v.size() - from);
  std::vector<at::Tensor> t = {
      at::from_blob(v.data() + from, {n}, at::TensorOptions().dtype(at::kDouble)).clone().to(impl_->device)};
  impl_->wait(impl_->pg->allreduce(t), "the sum of the losses");
  at::Tensor back = t[0].cpu();
  std::copy(back.data_ptr<double>(), back.data_ptr<double>() + n, v.begin() + std::ptrdiff_t(from));
}

int64_t DataParallel::from_rank0(int64_t value) {
  const std::string k = impl_->key("rank0_value", int(impl_->broadcasts++));
  if (impl_->env.rank == 0) {
    impl_->store->set(k, bytes(std::to_string(value)));
    return value;
  }
  try {
    impl_->store->wait({k}, impl_->timeout);
    return std::stoll(text(impl_->store->get(k)));
  } catch (const std::exception& e) {
    throw impl_->failure("waiting for rank 0", message_of(e));
  }
}

void DataParallel::barrier() {
  c10d::BarrierOptions o;
  if (impl_->device.is_cuda()) o.device_ids = {impl_->env.local_rank};
  impl_->wait(impl_->pg->barrier(o), "the barrier");
}

void DataParallel::step_begins(int64_t step) {
  static const int64_t die_at = std::atoll(env_var("MIXBENCH_TEST_DIE_AT_STEP").value_or("0").c_str());
  static const int64_t hang_at = std::atoll(env_var("MIXBENCH_TEST_HANG_AT_STEP").value_or("0").c_str());
  static const int64_t fail_at = std::atoll(env_var("MIXBENCH_TEST_FAIL_AT_STEP").value_or("0").c_str());
  const bool last = impl_->env.rank == impl_->env.world - 1;
  if (last && die_at > 0 && step + 1 == die_at) ::raise(SIGKILL);
  if (last && fail_at > 0 && step + 1 == fail_at)
    throw std::runtime_error(fmt::format("MIXBENCH_TEST_FAIL_AT_STEP: step {} fails", fail_at));
  impl_->step = step;
  impl_->heartbeat(2 * step);
  while (last && hang_at > 0 && step + 1 == hang_at) std::this_thread::sleep_for(std::chrono::seconds(1));
}

void DataParallel::report_failure(const std::string& message) {
  try {
    impl_->store->set(impl_->key("failed", impl_->env.rank), bytes(message));
  } catch (...) {
  }
}

std::unique_ptr<GradientReducer> DataParallel::reducer(const Model& m, size_t bucket_bytes) {
  return std::make_unique<GradientReducer>(*this, m, bucket_bytes);
}

// ------------------------------------------------------------------ gradient buckets
struct GradientReducer::Impl {
  DataParallel::Impl& dp;
  struct Bucket {
    std::vector<size_t> members;  // indices into params
    size_t pending = 0;           // gradients not yet final in this backward
    bool launched = false;
    at::Tensor flat;
    c10::intrusive_ptr<c10d::Work> work;
  };
  std::vector<at::Tensor> params;
  std::vector<size_t> bucket_of;
  std::vector<char> ready;
  std::vector<Bucket> buckets;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // kept alive: they hold the hooks
  size_t next = 0;
  bool armed = false;
  std::exception_ptr error;
  std::mutex mu;

  explicit Impl(DataParallel::Impl& d) : dp(d) {}

  void launch(Bucket& b) {
    c10::NoGradGuard ng;
    std::vector<at::Tensor> parts;
    for (size_t i : b.members) {
      const at::Tensor g = params[i].grad();
      parts.push_back((g.defined() ? g : at::zeros_like(params[i])).reshape({-1}));
    }
    b.flat = at::cat(parts);
    b.launched = true;
    try {
      std::vector<at::Tensor> t = {b.flat};
      b.work = dp.pg->allreduce(t);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  // Launches the buckets that are complete, in bucket order (the same order on every rank).
  void launch_ready() {
    while (next < buckets.size() && buckets[next].pending == 0) launch(buckets[next++]);
  }
  void on_ready(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    if (!armed || ready[i]) return;
    ready[i] = 1;
    --buckets[bucket_of[i]].pending;
    launch_ready();
  }
};

GradientReducer::GradientReducer(DataParallel& dp, const Model& m, size_t bucket_bytes)
    : impl_(std::make_shared<Impl>(*dp.impl_)) {
  auto& I = *impl_;
  std::vector<at::Tensor> all;
  for (const auto& [n, t] : m.params)
    if (t.requires_grad()) all.push_back(t);
  // reverse order of definition: the backward finishes the last layers' gradients first
  size_t bytes_in = bucket_bytes;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const at::Tensor& p = *it;
    const size_t nb = size_t(p.numel()) * p.element_size();
    if (I.buckets.empty() || bytes_in + nb > bucket_bytes ||
        I.params[I.buckets.back().members.back()].scalar_type() != p.scalar_type()) {
      I.buckets.emplace_back();
      bytes_in = 0;
    }
    bytes_in += nb;
    I.buckets.back().members.push_back(I.params.size());
    I.bucket_of.push_back(I.buckets.size() - 1);
    I.params.push_back(p);
  }
  I.ready.assign(I.params.size(), 0);
  std::weak_ptr<Impl> weak = impl_;
  for (size_t i = 0; i < I.params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(I.params[i]);
    acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [weak, i](const torch::autograd::variable_list& out, const torch::autograd::variable_list&) {
          if (auto s = weak.lock()) s->on_ready(i);
          return out;
        }));
    I.accumulators.push_back(std::move(acc));
  }
}

GradientReducer::~GradientReducer() = default;

size_t GradientReducer::buckets() const { return impl_->buckets.size(); }

void GradientReducer::arm(bool on) {
  auto& I = *impl_;
  std::lock_guard<std::mutex> lock(I.mu);
  if (on && !I.armed) {
    std::fill(I.ready.begin(), I.ready.end(), 0);
    for (auto& b : I.buckets) {
      b.pending = b.members.size();
      b.launched = false;
      b.flat = at::Tensor();
      b.work.reset();
    }
    I.next = 0;
    I.error = nullptr;
  }
  I.armed = on;
}

void GradientReducer::finish() {
  auto& I = *impl_;
  I.dp.heartbeat(2 * I.dp.step + 1);
  {
    std::lock_guard<std::mutex> lock(I.mu);
    // gradients that never came (parameters this backward did not reach) count as zeros
    for (; I.next < I.buckets.size(); ++I.next) I.launch(I.buckets[I.next]);
    I.armed = false;
  }
  if (I.error) {
    try {
      std::rethrow_exception(I.error);
    } catch (const std::exception& e) {
      throw I.dp.failure("the gradient all-reduce", message_of(e));
    }
  }
  c10::NoGradGuard ng;
  for (auto& b : I.buckets) {
    I.dp.wait(b.work, "the gradient all-reduce");
    int64_t off = 0;
    for (size_t i : b.members) {
      at::Tensor& p = I.params[i];
      at::Tensor sum = b.flat.slice(0, off, off + p.numel()).view(p.sizes());
      off += p.numel();
      if (p.grad().defined()) p.mutable_grad().copy_(sum);
      else p.mutable_grad() = sum.clone();
    }
    b.flat = at::Tensor();
    b.work.reset();
  }
}

// ------------------------------------------------------------------ local launcher
namespace {

int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("cannot open a socket to choose a free port");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  if (!ok) throw std::runtime_error("cannot choose a free local port");
  return ntohs(a.sin_port);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {}", WTERMSIG(status));
  return "stopped";
}

}  // namespace

int spawn_local_ranks(int nproc, const std::string& device, const std::vector<std::string>& args) {
  if (nproc < 1) throw UsageError("--nproc must be >= 1");
  if (env_var("WORLD_SIZE") || env_var("RANK"))
    throw UsageError("--nproc starts the ranks itself: unset torchrun's variables (WORLD_SIZE, RANK) or drop --nproc");
  if (device == "cuda") {
    const size_t gpus = at::getNumGPUs();
    if (size_t(nproc) > gpus)
      throw UsageError(fmt::format("--nproc {} with --device cuda: only {} GPU(s) are visible", nproc, gpus));
  }
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string port = std::to_string(free_local_port());
  std::vector<std::string> argv_s = {exe};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::cout << std::flush;
  std::cerr << std::flush;
  std::vector<pid_t> pids;
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      for (pid_t p : pids) ::kill(p, SIGKILL);
      throw std::runtime_error("fork failed while starting the ranks");
    }
    if (pid == 0) {
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::execv(exe.c_str(), argv.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  // Reaps the ranks; after the first failure the others get SIGTERM, and SIGKILL 10 s later.
  int rc = 0, remaining = nproc;
  std::optional<std::chrono::steady_clock::time_point> stopping;
  bool killed = false;
  while (remaining > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno != EINTR) break;
    if (pid <= 0) {
      if (stopping && !killed && std::chrono::steady_clock::now() - *stopping > std::chrono::seconds(10)) {
        for (pid_t p : pids)
          if (p > 0) ::kill(p, SIGKILL);
        killed = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    const auto it = std::find(pids.begin(), pids.end(), pid);
    if (it == pids.end()) continue;
    const int r = int(it - pids.begin());
    *it = -1;
    --remaining;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (ok || stopping) continue;
    rc = WIFEXITED(status) ? WEXITSTATUS(status) : 3;
    std::cerr << fmt::format("mixbench: error: rank {} {}; stopping the other ranks\n", r, describe(status));
    for (pid_t p : pids)
      if (p > 0) ::kill(p, SIGTERM);
    stopping = std::chrono::steady_clock::now();
  }
  return rc;
}

}  // namespace mixbench
