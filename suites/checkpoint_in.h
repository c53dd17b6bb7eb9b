// Parameters trained elsewhere, read into a mixbench model: a whole model's state dict (nanochat's
// GPT.state_dict() as converted by ci/nanochat_to_safetensors.py, or mixbench's own names, bare or
// as a training checkpoint's "param.<name>") and a single layer's (flash-linear-attention's or
// nanochat's attention names). Used by `mixbench eval --checkpoint` and `mixbench train --init-from`.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "harness/backbone.h"
#include "harness/safetensors.h"

namespace mixbench {

// The naming scheme a model state dict uses: "nanochat" when it holds transformer.wte.weight,
// else "mixbench".
std::string model_state_scheme(const SafetensorsFile& f);

// Config overrides ("k=v,...") from a converted nanochat checkpoint's metadata (sequence_len,
// vocab_size, n_layer, n_head, n_kv_head, n_embd, window_pattern); "" when it has none.
// InputError naming the field for a value that is not a number where one is needed.
std::string nanochat_config_overrides(const std::map<std::string, std::string>& meta, const std::string& where);

// Every parameter of `model` from the file (converted to the model's dtype and device). InputError
// ("checkpoint 'PATH': ...") naming the tensor for an unknown name, a missing parameter or a shape
// the config contradicts.
void load_model_state(const SafetensorsFile& f, const std::string& path, Model& model);

// A single layer's state dict in `scheme` ("fla" or "nanochat"; "" = whichever names it uses)
// loaded into each block of `layers` of the model (all blocks when empty). The layer's parameters
// that the scheme has no name for (a value-embedding gate) keep their values. InputError as above.
void load_layer_state(const SafetensorsFile& f, const std::string& path, Model& model, std::vector<int64_t> layers,
                      const std::string& scheme);

}  // namespace mixbench
