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
#include "suites/unit_golden.h"

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

// A layer or model golden of one method (suites/unit_golden.h).
int write_method_golden(const std::string& method, const Args& a) {
  if (a.get("op") || a.get("model")) throw UsageError("golden --method takes no --op or --model");
  auto out = a.get("out");
  if (!out) throw UsageError("golden --method NAME needs --out FILE");
  UnitGoldenRequest req;
  req.method = method;
  req.level = a.get_or("level", "layer");
  req.config = a.get_or("config", "");
  req.names = a.get_or("names", "");
  req.batch = a.get_int("batch", 1);
  req.seq_len = a.get_int("seq-len", 17);
  req.layer = a.get_int("layer", -1);
  if (a.get("layer") && (req.layer < 0 || req.level != "layer")) throw UsageError("--layer takes an index >= 0, at --level layer");
  req.seed = uint64_t(a.get_int("seed", 0));
  const size_t n = write_unit_golden(req, *out);
  std::cout << fmt::format("wrote {} ({} tensors)\n", *out, n);
  return 0;
}

int run_golden_command(const Args& a, const std::vector<std::string>&) {
  if (auto method = a.get("method")) return write_method_golden(*method, a);
  if (a.get("level") || a.get("names") || a.get("layer")) throw UsageError("--level, --names and --layer go with --method NAME");
  if (auto model = a.get("model")) return write_model_goldens(*model, a);
  auto op = a.get("op");
  auto out = a.get("out");
  if (!op || !out)
    throw UsageError("golden needs --op NAME and --out FILE (or --method NAME --level layer|model --out FILE, or "
                     "--model NAME|all --out-dir DIR)");
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
          "write a golden file from an op's, a layer's or a model's FP64 reference (inputs, outputs, cotangents, gradients)",
          "",
          "the file is safetensors with the op and its parameters as metadata; `conformance --golden` checks it. "
          "With --model: DIR/<method>.safetensors holds a whole small FP64 model's parameters, inputs, logits and "
          "every parameter gradient at T = 1, 17, 64 (the CTest ModelGolden checks them), and with all also "
          "DIR/account.json, the accountant's numbers. With --method: one method's layer (--level layer: hidden "
          "states x in, y out) or whole small model (--level model: token ids in, logits out), with every "
          "parameter, the cotangents and every gradient, parameters optionally under another implementation's "
          "names (--names nanochat|fla, docs/foreign-names.md); `conformance --golden` checks it",
          {{"op", OptionKind::Value, "NAME", "the registered op (required unless --model or --method)"},
           {"method", OptionKind::Value, "NAME", "write a layer- or model-level golden of this method instead"},
           {"level", OptionKind::Value, "layer|model", "with --method: the layer (default) or the whole small model"},
           {"names", OptionKind::Value, "nanochat|fla", "with --method: the parameters under another implementation's names"},
           {"layer", OptionKind::Value, "I", "with --level layer: the layer's index (default: the first without a value embedding)"},
           {"model", OptionKind::Value, "NAME,...|all", "write model-level goldens of these methods instead"},
           {"out-dir", OptionKind::Value, "DIR", "with --model: the folder to write into"},
           {"config", OptionKind::Value, "k=v,...", "overrides of the op's parameters"},
           {"batch", OptionKind::Value, "B", "batch size of the inputs (default 2; with --method 1)"},
           {"seq-len", OptionKind::Value, "T", "sequence length of the inputs (default 33; with --method 17)"},
           {"seed", OptionKind::Value, "N", "seed of the inputs and cotangents (default 0)"},
           {"dtype", OptionKind::Value, "NAME", "ignored: the file holds the FP64 reference's tensors"},
           {"out", OptionKind::Value, "FILE.safetensors", "the file to write (required)"}},
          run_golden_command};
}

}  // namespace mixbench
