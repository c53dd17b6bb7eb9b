// Model-level regression: every registered method (hybrids too) as a whole small FP64 model against
// the logits and parameter gradients frozen in tests/goldens/model/, and the accountant's numbers
// against tests/goldens/model/account.json. Regenerate (only after a deliberate change of numbers)
// with `mixbench golden --model all --out-dir tests/goldens/model`.
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "tests/source_dir.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/registry.h"
#include "harness/safetensors.h"
#include "suites/model_golden.h"

namespace mixbench {
namespace {

namespace fs = std::filesystem;
const fs::path kDir = fs::path(mixbench_test::source_dir()) / "tests" / "goldens" / "model";

TEST(ModelGoldens, EveryMethodHasAFileAndEveryFileAMethod) {
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(kDir))
    if (e.path().extension() == ".safetensors") files.insert(e.path().stem().string());
  for (const MethodSpec* m : Registry::get().methods()) {
    EXPECT_TRUE(files.count(m->name)) << "no model golden for " << m->name;
    files.erase(m->name);
  }
  for (const auto& f : files) ADD_FAILURE() << "model golden " << f << " names no registered method";
}

class ModelGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelGolden, LogitsAndGradientsMatch) {
  const fs::path p = kDir / (GetParam() + ".safetensors");
  ASSERT_TRUE(fs::exists(p)) << p;
  std::vector<GoldenDiff> diffs = check_model_golden(p.string());
  // logits, reference logits and one gradient per parameter at each of the three lengths
  ASSERT_GT(diffs.size(), size_t(3 * 3));
  for (const auto& d : diffs) EXPECT_TRUE(d.pass) << GetParam() << " " << d.tensor << " rel " << d.rel;
}

std::vector<std::string> method_names() {
  std::vector<std::string> out;
  for (const MethodSpec* m : Registry::get().methods()) out.push_back(m->name);
  return out;
}
INSTANTIATE_TEST_SUITE_P(All, ModelGolden, ::testing::ValuesIn(method_names()),
                         [](const auto& info) { return info.param; });

// The check can fail: a parameter nudged by 1e-9 relative, a gradient file entry changed, a
// parameter the model lacks.
TEST(ModelGoldens, CheckCatchesChanges) {
  const fs::path src = kDir / "dense_full.safetensors";
  SafetensorsFile f = read_safetensors(src.string());
  const fs::path tmp = fs::temp_directory_path() / "mixbench_model_golden_fault.safetensors";

  auto failing = [&](const TensorMap& t) {
    write_safetensors(tmp.string(), t, f.metadata);
    int n = 0;
    for (const auto& d : check_model_golden(tmp.string())) n += d.pass ? 0 : 1;
    return n;
  };
  EXPECT_EQ(failing(f.tensors), 0);

  TensorMap nudged = f.tensors;  // an input parameter changes → outputs no longer match
  nudged.set("param.layers.0.mlp.c_fc", f.tensors.at("param.layers.0.mlp.c_fc") * (1.0f + 1e-6f));
  EXPECT_GT(failing(nudged), 0);

  TensorMap grad = f.tensors;  // one stored gradient changes by 1e-9 relative
  grad.set("grad.T17.wte", f.tensors.at("grad.T17.wte") * (1.0 + 1e-9));
  EXPECT_EQ(failing(grad), 1);

  TensorMap extra = f.tensors;
  extra.set("param.not_a_parameter", f.tensors.at("param.smear_lambda"));
  EXPECT_GT(failing(extra), 0);
  fs::remove(tmp);
}

TEST(ModelGoldens, AccountantNumbersUnchanged) {
  const nlohmann::json stored = nlohmann::json::parse(read_file((kDir / "account.json").string()));
  std::vector<GoldenDiff> diffs = check_account_golden(stored);
  ASSERT_GT(diffs.size(), Registry::get().methods().size() * 2 * 10);
  for (const auto& d : diffs) EXPECT_TRUE(d.pass) << d.tensor << " rel " << d.rel;
  nlohmann::json changed = stored;
  changed["dense_full"]["default_config"]["fwd_flops"] = stored["dense_full"]["default_config"]["fwd_flops"].get<double>() * (1 + 1e-9);
  int failing = 0;
  for (const auto& d : check_account_golden(changed)) failing += d.pass ? 0 : 1;
  EXPECT_EQ(failing, 1);
}

TEST(ModelGoldens, MalformedFileIsAnInputError) {
  const fs::path tmp = fs::temp_directory_path() / "mixbench_model_golden_bad.safetensors";
  write_safetensors(tmp.string(), TensorMap{{"x", at::zeros({1})}}, {{"format", "something-else"}});
  EXPECT_THROW(check_model_golden(tmp.string()), InputError);
  EXPECT_THROW(check_model_golden((kDir / "no_such_method.safetensors").string()), InputError);
  fs::remove(tmp);
}

}  // namespace
}  // namespace mixbench
