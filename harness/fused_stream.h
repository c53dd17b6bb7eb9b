// A residual stream that fuses its updates in a static-cache decode step. In a decode step without
// gradient over static caches the backbone (harness/backbone.cpp) asks its stream for this
// interface (dynamic_cast) and, when the stream has it, calls these in place of read + RMSNorm +
// modulate, write and finish: the stream may defer a sublayer's output and add it to the residual in
// the next input's op (harness/decode_ops.h: the add, the stream's mix and the norm in one launch
// on a GPU). The values are those of the unfused calls.
#pragma once
#include <ATen/core/Tensor.h>

#include "harness/decode_ops.h"
#include "harness/residual.h"

namespace mixbench {

class FusedDecodeStream {
 public:
  virtual ~FusedDecodeStream() = default;
  // What sublayer `s` reads: modulate(norm(read(s))), with any deferred output added first.
  virtual at::Tensor fused_input(TensorMap& state, const Sublayer& s, const TensorMap& params) const = 0;
  // A GEMV of sublayer s's input, fused_input(s)·Wᵀ (W [N, d]; relu_square: relu(·)², the MLP's first
  // half), and, when `normed` is given, that input itself; a stream may form them in the input's op.
  virtual at::Tensor fused_input_linear(TensorMap& state, const Sublayer& s, const TensorMap& params, const at::Tensor& W,
                                        bool relu_square, at::Tensor* normed = nullptr) const {
    const at::Tensor x = fused_input(state, s, params);
    if (normed) *normed = x;
    return relu_square ? linear_relu_square(x, W) : linear_rows(x, W);
  }
  // Takes the sublayer's output y [B,T,d] (it may be deferred to the next fused_input or fused_finish).
  virtual void fused_write(TensorMap& state, const Sublayer& s, const at::Tensor& y, const TensorMap& params) const = 0;
  // finish()'s value; *normed: its final RMSNorm (backbone_rms_norm) when the stream formed it in the
  // same op, else left undefined (the backbone norms it).
  virtual at::Tensor fused_finish(TensorMap& state, const TensorMap& params, Backend backend, at::Tensor* normed) const = 0;
};

}  // namespace mixbench
