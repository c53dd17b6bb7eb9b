#!/usr/bin/env python3
"""Layer-level goldens from flash-linear-attention's own layer classes (fla 0.6.0), in float64 on
the CPU: GatedDeltaNet (mixbench `gdn`), DeltaNet (`deltanet`), KimiDeltaAttention (`kda`),
GatedLinearAttention (`gla`) and MultiScaleRetention (`retnet`). Called by
make_original_goldens.py (or alone: python3 make_fla_layer_goldens.py OUT_DIR).

The layers' own code (projections, the short convolutions' placement, gates, norms, head
reshapes) runs unchanged; the pieces that only exist as Triton/CUDA kernels are substituted, as
each file's metadata "substitutions" says:
  - ShortConvolution.forward: plain depthwise F.conv1d with W−1 zeros of left padding, then the
    module's activation (silu); GatedDeltaNet's fused q/k/v conv path is turned off so each of
    q_conv1d, k_conv1d, v_conv1d runs as its own module (the same arithmetic)
  - FusedRMSNormGated / RMSNorm .forward: x·rsqrt(mean(x²) + eps)·weight [· silu(g) | sigmoid(g)]
  - chunk_gated_delta_rule: l2norm (x/√(Σx² + 1e-6), fla's l2norm) of q and k, the gate
    fla.ops.gated_delta_rule.gate.naive_gdn_gate(g, A_log, dt_bias), sigmoid(beta), then
    fla.ops.gated_delta_rule.naive.naive_recurrent_gated_delta_rule
  - chunk_delta_rule and fused_recurrent_delta_rule (DeltaNet picks the latter for T <= 64): the same
    l2norm, then fla.ops.delta_rule.naive.delta_rule_recurrence
  - chunk_kda (and fused_recurrent_kda): the same l2norm, fla.ops.kda.gate.naive_kda_gate,
    sigmoid(beta), then fla.ops.kda.naive.naive_recurrent_kda
  - chunk_gla / fused_chunk_gla / fused_recurrent_gla: fla.ops.gla.naive.naive_recurrent_gla
  - chunk_retention / fused_recurrent_retention: the per-head decay log(1 − 2^(−5−h)) as
    chunk_retention computes it (in float64 here), then fla.ops.simple_gla.naive.naive_recurrent_simple_gla
  - RotaryEmbedding.forward (Triton): the same rotation in torch, non-interleaved halves,
    x1·cos − x2·sin, x2·cos + x1·sin, angles t·base^(−2i/d) in float64
  - fla's naive references upcast to float32: while they run, .float()/.to(float32) leave float64
    tensors in float64 (make_fla_goldens.keep_float64)
"""
import math
import os
import sys
import warnings

import torch
import torch.nn.functional as F

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fla_goldens import keep_float64  # noqa: E402

F64 = torch.float64
F32_EPS = float(torch.finfo(torch.float32).eps)
SUBST = ("ShortConvolution = depthwise F.conv1d + activation; (Fused)RMSNorm(Gated) = torch formula; "
         "chunk kernels = l2norm(eps 1e-6) + fla naive gate/beta + fla naive recurrent reference; "
         ".float() kept in float64 inside the naive references")


def l2norm(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def patch_fla():
    import fla.layers.delta_net as dn
    import fla.layers.gated_deltanet as gdn
    from fla.modules import FusedRMSNormGated, RMSNorm, ShortConvolution
    from fla.ops.delta_rule.naive import delta_rule_recurrence
    from fla.ops.gated_delta_rule.gate import naive_gdn_gate
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

    def conv_forward(self, x, residual=None, mask=None, cache=None, output_final_state=False, cu_seqlens=None, **kw):
        assert residual is None and mask is None and cache is None and cu_seqlens is None
        W = self.weight.shape[-1]
        y = F.conv1d(F.pad(x.transpose(1, 2), (W - 1, 0)), self.weight, self.bias, groups=self.weight.shape[0])
        y = y.transpose(1, 2)
        if self.activation in ("silu", "swish"):
            y = F.silu(y)
        elif self.activation is not None:
            raise NotImplementedError(self.activation)
        return y, None

    def gated_norm_forward(self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return y * (torch.sigmoid(g) if self.activation == "sigmoid" else F.silu(g))

    def norm_forward(self, x, residual=None, prenorm=False, residual_in_fp32=False):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def chunk_gdr(q, k, v, g, beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
                  use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, use_gate_in_kernel=False, A_log=None,
                  dt_bias=None, cu_seqlens=None, state_v_first=True, scale=None, **kw):
        assert initial_state is None and cu_seqlens is None and not allow_neg_eigval
        if use_qk_l2norm_in_kernel:
            q, k = l2norm(q), l2norm(k)
        with keep_float64():
            if use_gate_in_kernel:
                g = naive_gdn_gate(g, A_log, dt_bias, output_dtype=g.dtype)
            if use_beta_sigmoid_in_kernel:
                beta = beta.sigmoid()
            o, _ = naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale=scale)
        return o.to(v.dtype), None

    def chunk_dr(q, k, v, beta, initial_state=None, output_final_state=False, cu_seqlens=None,
                 use_qk_l2norm_in_kernel=False, scale=None, **kw):
        assert initial_state is None and cu_seqlens is None and scale is None
        if use_qk_l2norm_in_kernel:
            q, k = l2norm(q), l2norm(k)
        t = lambda x: x.transpose(1, 2).contiguous()  # noqa: E731  [B,T,H,.] -> [B,H,T,.]
        with keep_float64():
            o, _ = delta_rule_recurrence(t(q), t(k), t(v), t(beta), output_final_state=False)
        return t(o), None

    import fla.layers.gla as gla_mod
    import fla.layers.kda as kda_mod
    import fla.layers.multiscale_retention as ret_mod
    from fla.modules.rotary import RotaryEmbedding
    from fla.ops.gla.naive import naive_recurrent_gla
    from fla.ops.kda.gate import naive_kda_gate
    from fla.ops.kda.naive import naive_recurrent_kda
    from fla.ops.simple_gla.naive import naive_recurrent_simple_gla

    def kda_rule(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, output_final_state=False,
                 use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                 allow_neg_eigval=False, lower_bound=None, cu_seqlens=None, scale=None, **kw):
        assert initial_state is None and cu_seqlens is None and not allow_neg_eigval and lower_bound is None
        if use_qk_l2norm_in_kernel:
            q, k = l2norm(q), l2norm(k)
        with keep_float64():
            if use_gate_in_kernel:
                g = naive_kda_gate(g, A_log, dt_bias, output_dtype=g.dtype)
            if use_beta_sigmoid_in_kernel:
                beta = beta.sigmoid()
            o, _ = naive_recurrent_kda(q, k, v, g, beta, scale=scale)
        return o.to(v.dtype), None

    def gla_rule(q, k, v, g=None, gk=None, initial_state=None, output_final_state=False, cu_seqlens=None, scale=None,
                 **kw):
        assert initial_state is None and cu_seqlens is None and scale is None
        with keep_float64():
            o, _ = naive_recurrent_gla(q, k, v, gk if gk is not None else g)
        return o, None

    def retention_rule(q, k, v, initial_state=None, output_final_state=False, cu_seqlens=None, scale=None, **kw):
        assert initial_state is None and cu_seqlens is None
        H = q.shape[2]
        g_gamma = (1 - 2.0 ** (-5.0 - torch.arange(H, dtype=F64))).log()
        g = g_gamma.view(1, 1, H).expand(q.shape[0], q.shape[1], H).contiguous()
        with keep_float64():
            o, _ = naive_recurrent_simple_gla(q, k, v, g, scale=scale, output_final_state=False)
        return o, None

    def rotary_forward(self, q, k, seqlen_offset=0, cu_seqlens=None, max_seqlen=None, **kw):
        assert cu_seqlens is None and not self.interleaved and self.scale_base is None
        T, d = q.shape[1], self.dim
        inv = 1.0 / (self.base ** (torch.arange(0, d, 2, dtype=F64) / d))
        ang = torch.outer(torch.arange(seqlen_offset, seqlen_offset + T, dtype=F64), inv)
        cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]

        def rot(x):
            x1, x2 = x[..., : d // 2], x[..., d // 2:d]
            return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., d:]], -1)
        return rot(q), rot(k)

    kda_mod.chunk_kda = kda_mod.fused_recurrent_kda = kda_rule
    gla_mod.chunk_gla = gla_mod.fused_chunk_gla = gla_mod.fused_recurrent_gla = gla_rule
    ret_mod.chunk_retention = ret_mod.fused_recurrent_retention = retention_rule
    ret_mod.fused_chunk_retention = ret_mod.parallel_retention = retention_rule
    RotaryEmbedding.forward = rotary_forward
    ShortConvolution.forward = conv_forward
    FusedRMSNormGated.forward = gated_norm_forward
    RMSNorm.forward = norm_forward
    gdn.GatedDeltaNet._use_fused_qkv_conv = lambda self, **kw: False
    gdn.chunk_gated_delta_rule = chunk_gdr
    dn.chunk_delta_rule = chunk_dr
    dn.fused_recurrent_delta_rule = chunk_dr  # DeltaNet picks it for T <= 64: the same rule


def randomize(layer, gen):
    with torch.no_grad():
        for n, p in layer.named_parameters():
            if n.endswith("conv1d.weight"):
                p.copy_(torch.randn(p.shape, generator=gen, dtype=F64) / math.sqrt(p.shape[-1]))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=F64) / math.sqrt(p.shape[1]))
            else:
                p.copy_(1.0 + 0.25 * torch.randn(p.shape, generator=gen, dtype=F64))


def layer_golden(path, cls_name, method, layer, mixbench_cfg, B, T, seed, fla_version):
    g = torch.Generator().manual_seed(seed)
    randomize(layer, g)
    layer.train()
    d = mixbench_cfg["d_model"]
    x = torch.randn(B, T, d, generator=g, dtype=F64, requires_grad=True)
    y = layer(x)[0]
    dy = torch.randn(y.shape, generator=g, dtype=F64)
    (y * dy).sum().backward()
    tensors = {"x": x, "y": y, "dy": dy, "grad_x": x.grad}
    for n, p in layer.named_parameters():
        tensors[n] = p
        tensors["grad_" + n] = p.grad
    # layer 0 of a 2-layer model has no value embedding (nanochat's rule: the last layer has one)
    meta = dict(mixbench_cfg, method=method, level="layer", layer=0, names="fla", seed=seed,
                source=f"flash-linear-attention {fla_version} fla.layers.{cls_name}", substitutions=SUBST)
    from safetensors.torch import save_file
    save_file({n: t.detach().contiguous() for n, t in tensors.items()}, path,
              metadata={k: str(v) for k, v in meta.items()})
    print("wrote", path, len(tensors), "tensors")


def main_all(out):
    import fla
    from fla.layers import DeltaNet, GatedDeltaNet, GatedLinearAttention, KimiDeltaAttention, MultiScaleRetention
    patch_fla()
    d, H, K = 64, 4, 16
    cfg = dict(n_layer=2, d_model=d, head_dim=K, seq_len=64, vocab=64, head_v_dim=0, conv_size=4, norm_eps=1e-5)
    layer = GatedDeltaNet(hidden_size=d, expand_v=1, head_dim=K, num_heads=H, conv_size=4, norm_eps=1e-5).to(F64)
    layer_golden(os.path.join(out, "fla_gdn_layer.safetensors"), "GatedDeltaNet", "gdn", layer,
                 dict(cfg, gate_bias_offset=0.0), 2, 37, 3, fla.__version__)
    layer = DeltaNet(hidden_size=d, expand_k=1, expand_v=1, num_heads=H, conv_size=4, norm_eps=1e-5).to(F64)
    layer_golden(os.path.join(out, "fla_deltanet_layer.safetensors"), "DeltaNet", "deltanet", layer, cfg, 2, 37, 4,
                 fla.__version__)
    layer = KimiDeltaAttention(hidden_size=d, expand_v=1, head_dim=K, num_heads=H, conv_size=4, norm_eps=1e-5).to(F64)
    layer_golden(os.path.join(out, "fla_kda_layer.safetensors"), "KimiDeltaAttention", "kda", layer,
                 dict(cfg, gate_bias_offset=0.0), 2, 37, 5, fla.__version__)
    # mixbench's gla and retnet normalise their output with float32's epsilon (nanochat's F.rms_norm
    # default): fla's layers are built with that norm_eps, and with K = V = head_dim
    base = dict(n_layer=2, d_model=d, head_dim=K, seq_len=64, vocab=64)
    layer = GatedLinearAttention(hidden_size=d, expand_k=1, expand_v=1, num_heads=H, norm_eps=F32_EPS).to(F64)
    layer_golden(os.path.join(out, "fla_gla_layer.safetensors"), "GatedLinearAttention", "gla", layer,
                 dict(base, gate_low_rank=16, gate_logit_normalizer=16.0), 2, 37, 6, fla.__version__)
    layer = MultiScaleRetention(hidden_size=d, expand_k=1, expand_v=1, num_heads=H, norm_eps=F32_EPS).to(F64)
    layer_golden(os.path.join(out, "fla_retnet_layer.safetensors"), "MultiScaleRetention", "retnet", layer,
                 dict(base, rope_base=10000.0), 2, 37, 7, fla.__version__)


if __name__ == "__main__":
    os.makedirs(sys.argv[1], exist_ok=True)
    main_all(sys.argv[1])
