// mixbench eval: the validation loss of a model whose parameters come from a checkpoint (nanochat's
// state dict converted by ci/nanochat_to_safetensors.py, or mixbench's own), suites/checkpoint_in.h.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <iostream>

#include "harness/backbone.h"
#include "harness/cli/commands.h"
#include "harness/cli/common.h"
#include "harness/errors.h"
#include "harness/metrics.h"
#include "harness/report.h"
#include "harness/safetensors.h"
#include "suites/checkpoint_in.h"
#include "suites/train_data.h"

namespace mixbench {

namespace {

using Json = nlohmann::json;

struct Tally {
  double nats = 0, count = 0, bytes = 0, nats_bytes = 0;  // Σ CE, targets, Σ bytes, Σ CE over tokens with bytes
  bool have_bytes = false;
};

// Cross-entropy (nats) of the rows, summed over targets != −1; with token_bytes (int [vocab]) also
// nanochat's bits-per-byte sums (tokens of 0 bytes, the special ones, left out).
void add_rows(Tally& s, const Model& m, const at::Tensor& idx, const at::Tensor& targets, const at::Tensor& token_bytes,
              int64_t batch) {
  c10::NoGradGuard ng;
  for (int64_t r0 = 0; r0 < idx.size(0); r0 += batch) {
    const int64_t r1 = std::min(idx.size(0), r0 + batch);
    const at::Tensor x = idx.slice(0, r0, r1), y = targets.slice(0, r0, r1).reshape({-1});
    const at::Tensor logits = model_forward(m, x, Backend::CPU);
    const at::Tensor ce = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kDouble), y, {},
                                                 at::Reduction::None, -1);
    const at::Tensor valid = (y != -1).to(at::kDouble);
    s.nats += (ce * valid).sum().item<double>();
    s.count += valid.sum().item<double>();
    if (token_bytes.defined()) {
      const at::Tensor b = at::where(y >= 0, token_bytes.index_select(0, y.clamp_min(0)), at::zeros_like(y)).to(at::kDouble);
      s.bytes += b.sum().item<double>();
      s.nats_bytes += (ce * (b > 0).to(at::kDouble)).sum().item<double>();
      s.have_bytes = true;
    }
  }
}

int run_eval_command(const Args& a, const std::vector<std::string>& argv) {
  auto ckpt = a.get("checkpoint");
  if (!ckpt) throw UsageError("eval needs --checkpoint FILE");
  const std::string level = a.get_or("level", "model");
  if (level == "layer")
    throw UsageError("eval --level layer: a single layer has no validation loss (it maps hidden states to hidden "
                     "states, with no tokens or head). Check a layer's state dict with a layer golden instead "
                     "(`mixbench conformance --golden FILE`, parameters under fla's or nanochat's names), or train "
                     "from it (`mixbench train --init-from FILE --init-level layer`)");
  if (level != "model") throw UsageError("--level takes model or layer");
  const std::string dtype = a.get_or("dtype", "fp64");
  if (dtype != "fp64" && dtype != "fp32") throw UsageError("eval --dtype takes fp64 or fp32 (on the CPU)");
  const SafetensorsFile f = read_safetensors(*ckpt, "checkpoint");
  const std::string where = fmt::format("checkpoint '{}'", *ckpt);
  const std::string scheme = model_state_scheme(f);
  const MethodSpec& m = Registry::get().method(a.get_or("method", "dense"));
  std::string overrides = scheme == "nanochat" ? nanochat_config_overrides(f.metadata, where) : "";
  if (auto c = a.get("config")) overrides += (overrides.empty() ? "" : ",") + *c;
  const Config cfg = m.config.parse(overrides);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);
  Model model = build_model(m, cfg, gen, at::TensorOptions().dtype(parse_dtype(dtype)));
  load_model_state(f, *ckpt, model);
  const int64_t batch = a.get_int("batch", 8);
  if (batch < 1) throw UsageError("--batch must be >= 1");
  Tally s;
  std::string data;
  if (auto tok = a.get("tokens")) {
    if (a.get("data")) throw UsageError("give --tokens FILE or --data, not both");
    data = *tok;
    const SafetensorsFile t = read_safetensors(*tok, "token file");
    for (const char* n : {"idx", "targets"})
      if (!t.tensors.has(n)) throw InputError(fmt::format("token file '{}': missing tensor '{}'", *tok, n));
    const at::Tensor idx = t.tensors.at("idx").to(at::kLong), targets = t.tensors.at("targets").to(at::kLong);
    if (idx.dim() != 2 || idx.sizes() != targets.sizes())
      throw InputError(fmt::format("token file '{}': idx {} and targets {} must both be [B, T]", *tok,
                                   c10::str(idx.sizes()), c10::str(targets.sizes())));
    if (idx.min().item<int64_t>() < 0 || idx.max().item<int64_t>() >= model.dims.vocab ||
        targets.min().item<int64_t>() < -1 || targets.max().item<int64_t>() >= model.dims.vocab)
      throw InputError(fmt::format("token file '{}': a token is outside the vocabulary of {} (targets may be -1)",
                                   *tok, model.dims.vocab));
    at::Tensor tb;
    if (t.tensors.has("token_bytes")) {
      tb = t.tensors.at("token_bytes").to(at::kLong);
      if (tb.dim() != 1 || tb.size(0) < model.dims.vocab)
        throw InputError(fmt::format("token file '{}': token_bytes must be [vocab]", *tok));
    }
    add_rows(s, model, idx, targets, tb, batch);
  } else {
    data = a.get_or("data", "text");
    const Corpus c = load_corpus(data, 0);
    if (c.max_token >= model.dims.vocab)
      throw InputError(fmt::format("data holds token {} but the vocabulary has {} entries", c.max_token, model.dims.vocab));
    const int64_t T = model.dims.seq_len, n = a.get_int("eval-batches", 4);
    if (n < 1) throw UsageError("--eval-batches must be >= 1");
    at::Tensor tb;
    if (c.byte_level) {  // bytes 0..255 are one byte each, BOS none
      tb = at::ones({model.dims.vocab}, at::TensorOptions().dtype(at::kLong));
      if (c.bos < model.dims.vocab) tb[c.bos] = 0;
    }
    for (int64_t k = 0; k < n; ++k) {
      at::Tensor x, y;
      get_batch(c.val, k * batch * (T + 1), batch, T, x, y);
      add_rows(s, model, x, y, tb, batch);
    }
  }
  if (s.count == 0) throw InputError("no target to evaluate (every target is -1)");
  const double loss = s.nats / s.count;
  Json r = {{"status", "pass"}, {"method", m.name}, {"level", "model"}, {"device", "cpu"}, {"dtype", dtype},
            {"config", cfg.to_json()}, {"checkpoint", *ckpt}, {"names", scheme}, {"data", data},
            {"tokens", int64_t(s.count)}, {"val_loss", loss}};
  if (s.have_bytes && s.bytes > 0) r["val_bpb"] = s.nats_bytes / (std::log(2.0) * s.bytes);
  else r["val_bits_per_token"] = loss / std::log(2.0);
  RunInfo info = run_info("eval", argv);
  info.config = {{"method", m.name}, {"config", cfg.str()}, {"checkpoint", *ckpt}, {"data", data}, {"dtype", dtype}};
  const Json report = make_report(info, Json::array({r}));
  if (auto out = a.get("out")) write_report(*out, report);
  std::cout << fmt::format("eval: {} {} — val_loss {:.12g} nats/token over {} tokens, {}\n", m.name, scheme, loss,
                           int64_t(s.count),
                           r.contains("val_bpb") ? fmt::format("val_bpb {:.9g}", r["val_bpb"].get<double>())
                                                 : fmt::format("{:.9g} bits/token", r["val_bits_per_token"].get<double>()));
  return 0;
}

}  // namespace

Command eval_command() {
  return {"eval",
          "validation loss and bits per byte of a model loaded from a checkpoint (nanochat's state dict or mixbench's)",
          "",
          "the checkpoint is safetensors: nanochat's GPT.state_dict() names (ci/nanochat_to_safetensors.py converts a "
          ".pt; its metadata sets the config) or mixbench's parameter names (a training checkpoint too); a shape "
          "that contradicts the config, an unknown or a missing tensor is an error (exit 2) naming the tensor",
          {{"checkpoint", OptionKind::Value, "FILE", "the model state dict (required)"},
           {"method", OptionKind::Value, "NAME", "the method the checkpoint is of (default dense)"},
           {"config", OptionKind::Value, "k=v,...", "config overrides (after those the checkpoint's metadata gives)"},
           {"level", OptionKind::Value, "model|layer", "model (default); layer is refused: a layer has no validation loss"},
           {"tokens", OptionKind::Value, "FILE", "safetensors with idx [B,T] and targets [B,T] (-1 ignored), optional token_bytes [vocab]"},
           {"data", OptionKind::Value, "synthetic|text|PATH", "evaluate on this corpus's validation stream instead (default text)"},
           {"batch", OptionKind::Value, "B", "rows per forward (default 8)"},
           {"eval-batches", OptionKind::Value, "N", "with --data: batches of B rows of seq_len tokens (default 4)"},
           {"dtype", OptionKind::Value, "fp64|fp32", "compute dtype on the CPU (default fp64)"},
           {"out", OptionKind::Value, "report.json", "write the JSON report"}},
          run_eval_command};
}

}  // namespace mixbench
