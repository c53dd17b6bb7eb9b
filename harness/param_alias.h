// Parameter names of other implementations mapped one to one to mixbench's, so that goldens and
// checkpoints written elsewhere (nanochat's GPT.state_dict(), flash-linear-attention's layers) can be
// read: each alias names the other implementation's tensor and the mixbench parameter it holds.
#pragma once
#include <string>
#include <vector>

namespace mixbench {

struct ParamAlias {
  std::string theirs;  // the name in the other implementation's state dict
  std::string ours;    // the mixbench parameter (a layer's ParamDef name, or a model's parameter path)
  // How their tensor becomes ours: the same elements in the same order with our shape (e.g. a
  // depthwise conv's [C, 1, W] as [C, W]), or transposed (2-D only).
  enum class Layout { Same, Reshape, Transpose } layout = Layout::Same;
  std::string note;  // why the layout or the value differs, when it does
  // Their first dimension padded up to a multiple of this (0: not padded): nanochat pads its
  // vocabulary to a multiple of 64 rows (wte, lm_head, value embeddings). Reading drops the rows
  // beyond ours; writing appends zero rows.
  int64_t pad_rows_to = 0;
  // > 0: the rows of each head of this width, a weight [heads·width, in], have their second half
  // negated (both ways: the map is its own inverse). A rotary embedding that rotates by +θ on the
  // halves (x1·cos − x2·sin, x2·cos + x1·sin) on q and k is one that rotates by −θ (mixbench's and
  // nanochat's) on q and k with their second halves negated: the same attention scores.
  int64_t negate_second_half_rows = 0;
  // Their shape for our shape `ours` (the Reshape's target must be given by their_shape).
  std::vector<int64_t> their_shape;  // Reshape: their shape; empty otherwise (derived from ours)
};

// A naming scheme's aliases plus what the other implementation has that mixbench lacks (and the
// reverse): written down beside the method or the backbone that follows it.
struct ParamAliases {
  std::vector<ParamAlias> aliases;
  std::vector<std::string> deviations;  // one sentence each: a deliberate difference and what a golden covers
};

}  // namespace mixbench
