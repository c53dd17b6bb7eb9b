// DSA's indexer size: the rule relative to the attention it selects for (H_I = max(1, ⌊H/2⌋),
// d_I = head_dim, ⌊d_I/2⌋ rotary dims rounded down to even, as V3.2's 64 × 128 for 128 heads of 128),
// the accountant's `indexer_share` and its bound at every training preset, calibration within ±2%
// (DSA and its LT2 hybrid).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "harness/backbone.h"
#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/registry.h"
#include "suites/account.h"
#include "suites/leaderboard.h"
#include "suites/train_presets.h"

using namespace mixbench;
using Json = nlohmann::json;

namespace {

// The bound the size rule keeps the indexer's share of its layer's training FLOPs below.
constexpr double kIndexerShareBound = 0.3;

std::vector<int64_t> shape_of(const MethodSpec& m, const Config& cfg, const std::string& name) {
  for (const ParamDef& p : m.params(cfg, LayerCtx{1, 4, -1}))
    if (p.name == name) return p.shape;
  return {};
}

AccountResult account(const std::string& method, const std::string& config) {
  AccountOptions opt;
  opt.method = method;
  opt.config = config;
  return run_account(opt);
}

}  // namespace

TEST(DsaIndexerSize, RuleFollowsTheAttentionWidth) {
  const MethodSpec& m = Registry::get().method("dsa");
  struct Want {
    int64_t d, dh, HI, DI, R;
  };
  // d12, small, tiny, one head, odd head counts, small head dims
  for (const Want& w : std::vector<Want>{{768, 128, 3, 128, 64}, {384, 64, 3, 64, 32}, {128, 32, 2, 32, 16},
                                         {64, 64, 1, 64, 32},    {320, 64, 2, 64, 32}, {60, 12, 2, 12, 6},
                                         {36, 12, 1, 12, 6},     {40, 20, 1, 20, 10}}) {
    const Config cfg = m.config.parse(fmt::format("n_layer=4,d_model={},head_dim={}", w.d, w.dh));
    EXPECT_EQ(shape_of(m, cfg, "idx_wq"), (std::vector<int64_t>{w.HI * w.DI, w.d})) << w.d;
    EXPECT_EQ(shape_of(m, cfg, "idx_wk"), (std::vector<int64_t>{w.DI, w.d})) << w.d;
    EXPECT_EQ(shape_of(m, cfg, "idx_w"), (std::vector<int64_t>{w.HI, w.d})) << w.d;
    const LayerCost lc = m.account(cfg, LayerCtx{0, 4, -1}, CostQuery{256, 256, 2});
    EXPECT_NE(lc.formula.find(fmt::format("H_I={}, d_I={}, rope {}", w.HI, w.DI, w.R)), std::string::npos) << lc.formula;
  }
  // an odd ⌊d_I/2⌋ rounds down to even: head_dim 18 → 8 rotary dims
  const Config odd = m.config.parse("n_layer=4,d_model=36,head_dim=18");
  EXPECT_NE(m.account(odd, LayerCtx{0, 4, -1}, CostQuery{64, 64, 2}).formula.find("d_I=18, rope 8"), std::string::npos);
  // explicit sizes win; bad ones name the problem
  const Config own = m.config.parse("n_layer=4,d_model=768,head_dim=128,idx_heads=64,idx_dim=128,idx_rope_dim=64");
  EXPECT_EQ(shape_of(m, own, "idx_wq"), (std::vector<int64_t>{64 * 128, 768}));
  EXPECT_THROW(m.config.parse("idx_rope_dim=3"), InputError);
  EXPECT_THROW(m.config.parse("head_dim=32,d_model=128,idx_rope_dim=34"), InputError);  // above d_I = head_dim
  EXPECT_THROW(m.config.parse("idx_dim=1"), InputError);
  EXPECT_THROW(m.config.parse("idx_rope_dim=-2"), InputError);
}

// At every training preset (its backbone and dsa's own overrides, and the calibrated shape), the
// indexer takes less than kIndexerShareBound of its layer's training FLOPs; V3.2's own 64 × 128
// would take most of the d12 layer.
TEST(DsaIndexerSize, IndexerShareBelowTheBoundAtEveryPreset) {
  int presets = 0;
  for (auto it = train_presets_table().begin(); it != train_presets_table().end(); ++it) {
    ++presets;
    const TrainPreset P = train_preset(it.key());
    const Calibration c = calibrate("dsa", it.key());
    EXPECT_TRUE(c.within) << it.key() << " residual " << c.residual;
    for (const std::string shape : {std::string(), c.config}) {
      const AccountResult r = account("dsa", P.config_for("dsa") + (shape.empty() ? "" : "," + shape));
      ASSERT_TRUE(r.row.contains("indexer_share")) << it.key();
      const double share = r.row["indexer_share"].get<double>();
      EXPECT_GT(share, 0.0) << it.key();
      EXPECT_LT(share, kIndexerShareBound) << it.key() << " " << shape;
      // per layer, the indexer's FLOPs over the layer's training FLOPs; the result's is the largest
      double largest = 0;
      for (size_t i = 0; i < r.cost.layers.size(); ++i) {
        const Json& l = r.row["layers"][i];
        EXPECT_NEAR(l["indexer_share"].get<double>(),
                    l["indexer_train_flops"].get<double>() / layer_train_flops(r.cost.layers[i]), 1e-12);
        largest = std::max(largest, l["indexer_share"].get<double>());
      }
      EXPECT_EQ(largest, share);
    }
  }
  EXPECT_GE(presets, 3);
  // DSA's hybrid calibrates at every preset too (at tiny only with the MLP slope its loops bill)
  for (auto it = train_presets_table().begin(); it != train_presets_table().end(); ++it) {
    const Calibration c = calibrate("lt2_hybrid_gdn_dsa", it.key());
    EXPECT_TRUE(c.within) << it.key() << " residual " << c.residual << " at " << c.config;
  }
  const AccountResult v32 =
      account("dsa", train_preset("gpu-d12").config_for("dsa") + ",idx_heads=64,idx_dim=128,idx_rope_dim=64");
  EXPECT_GT(v32.row["indexer_share"].get<double>(), 0.75);
  // the rule's model is cheaper than dense at d12 (top-256 of 2048 keys); V3.2's indexer is not
  const AccountResult rule = account("dsa", train_preset("gpu-d12").config_for("dsa"));
  const AccountResult dense = account("dense", train_preset("gpu-d12").config_for("dense"));
  EXPECT_LT(rule.cost.train_flops_nanochat, dense.cost.train_flops_nanochat);
  EXPECT_GT(v32.cost.train_flops_nanochat, 2.0 * dense.cost.train_flops_nanochat);
}

// The share appears wherever a DSA layer runs (a hybrid's DSA layers) and nowhere else; the text
// summary prints it.
TEST(DsaIndexerSize, ShareIsReportedForDsaLayersOnly) {
  const AccountResult h = account("lt2_hybrid_gdn_dsa", "n_layer=5,d_model=64,head_dim=16,seq_len=64,vocab=64");
  ASSERT_TRUE(h.row.contains("indexer_share"));
  int with = 0;
  for (const Json& l : h.row["layers"]) {
    EXPECT_EQ(l.contains("indexer_share"), l["method"] == "dsa") << l.dump();
    with += l.contains("indexer_share");
  }
  EXPECT_GE(with, 4);
  EXPECT_FALSE(account("dense_full", "n_layer=2,d_model=64,head_dim=16,seq_len=64,vocab=64").row.contains("indexer_share"));
  testing::internal::CaptureStdout();
  EXPECT_EQ(run_cli({"account", "--method", "dsa", "--config", "n_layer=2,d_model=64,head_dim=16,seq_len=64,vocab=64"}), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("indexer share of its layer's training FLOPs"), std::string::npos) << out;
}
