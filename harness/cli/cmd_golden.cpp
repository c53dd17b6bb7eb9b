// mixbench golden: write a golden file from an op's FP64 reference (suites/golden.h).
#include <fmt/format.h>

#include <iostream>

#include "harness/cli/commands.h"
#include "harness/errors.h"
#include "suites/golden.h"

namespace mixbench {

namespace {

int run_golden_command(const Args& a, const std::vector<std::string>&) {
  auto op = a.get("op");
  auto out = a.get("out");
  if (!op || !out) throw UsageError("golden needs --op NAME and --out FILE");
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
          "the file is safetensors with the op and its parameters as metadata; `conformance --golden` checks it",
          {{"op", OptionKind::Value, "NAME", "the registered op (required)"},
           {"config", OptionKind::Value, "k=v,...", "overrides of the op's parameters"},
           {"batch", OptionKind::Value, "B", "batch size of the inputs (default 2)"},
           {"seq-len", OptionKind::Value, "T", "sequence length of the inputs (default 33)"},
           {"seed", OptionKind::Value, "N", "seed of the inputs and cotangents (default 0)"},
           {"dtype", OptionKind::Value, "NAME", "ignored: the file holds the FP64 reference's tensors"},
           {"out", OptionKind::Value, "FILE.safetensors", "the file to write (required)"}},
          run_golden_command};
}

}  // namespace mixbench
