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
};

// A naming scheme's aliases plus what the other implementation has that mixbench lacks (and the
// reverse): written down beside the method or the backbone that follows it.
struct ParamAliases {
  std::vector<ParamAlias> aliases;
  std::vector<std::string> deviations;  // one sentence each: a deliberate difference and what a golden covers
};

}  // namespace mixbench
