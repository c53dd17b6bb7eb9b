// mixbench golden: write a golden file from an op's FP64 reference (suites/golden.h), or the
// model-level goldens of whole small models (suites/model_golden.h).
#include <fmt/format.h>

#include <iostream>

#include "harness/cli/commands.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/registry.h"
#include "suites/golden.h"
#include "suites/model_golden.h"

namespace mixbench {

namespace {

// Model-level goldens: every parameter, the inputs, logits and gradients of a whole small model.
int write_model_goldens(const std::string& which, const Args& a) {
  if (a.get("op") || a.get("out")) throw UsageError("golden --model takes --out-dir DIR, not --op / --out");
  const std::string dir = a.get_or("out-dir", "");
  if (dir.empty()) throw UsageError("golden --model NAME|all needs --out-dir DIR");
  std::vector<const MethodSpec*> methods;
  if (which == "all") methods = Registry::get().methods();
  else
    for (const auto& n : split(which, ',')) methods.push_back(&Registry::get().method(n));
  for (const MethodSpec* m : methods) {
    write_model_golden(*m, dir);
    std::cout << fmt::format("wrote {}/{}.safetensors\n", dir, m->name);
  }
  if (which == "all") {
    write_file_atomic(dir + "/account.json", account_golden().dump(1) + "\n");
    std::cout << fmt::format("wrote {}/account.json\n", dir);
  }
  return 0;
}

int run_golden_command(const Args& a, const std::vector<std::string>&) {
  if (auto model = a.get("model")) return write_model_goldens(*model, a);
  auto op = a.get("op");
  auto out = a.get("out");
  if (!op || !out) throw UsageError("golden needs --op NAME and --out FILE (or --model NAME|all --out-dir DIR)");
  GoldenRequest req;
  req.op = *op;
  req.config = a.get_or("config", "");
  req.batch = a.get_int("batch", 2);
  req.seq_len = a.get_int("seq-len", 33);
  if (req.batch < 1 || req.seq_len < 1) throw UsageError("--batch and --seq-len must be positive");
  req.seed = uint64_t(a.get_int("seed", 0));
  const size_t n = write_golden(req, *out);
  std::cout << fmt::format("wrote {} ({} tensors)\n", *out, n);
  return 0;
}

}  // namespace

Command golden_command() {
  return {"golden",
          "write a golden file from an op's FP64 reference (inputs, outputs, cotangents, gradients)",
          "",
          "the file is safetensors with the op and its parameters as metadata; `conformance --golden` checks it. "
          "With --model: DIR/<method>.safetensors holds a whole small FP64 model's parameters, inputs, logits and "
          "every parameter gradient at T = 1, 17, 64 (the CTest ModelGolden checks them), and with all also "
          "DIR/account.json, the accountant's numbers",
          {{"op", OptionKind::Value, "NAME", "the registered op (required unless --model)"},
           {"model", OptionKind::Value, "NAME,...|all", "write model-level goldens of these methods instead"},
           {"out-dir", OptionKind::Value, "DIR", "with --model: the folder to write into"},
           {"config", OptionKind::Value, "k=v,...", "overrides of the op's parameters"},
           {"batch", OptionKind::Value, "B", "batch size of the inputs (default 2)"},
           {"seq-len", OptionKind::Value, "T", "sequence length of the inputs (default 33)"},
           {"seed", OptionKind::Value, "N", "seed of the inputs and cotangents (default 0)"},
           {"dtype", OptionKind::Value, "NAME", "ignored: the file holds the FP64 reference's tensors"},
           {"out", OptionKind::Value, "FILE.safetensors", "the file to write (required)"}},
          run_golden_command};
}

}  // namespace mixbench
