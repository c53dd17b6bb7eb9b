"""mixbench's ops as PyTorch operators, torch.ops.mixbench, with flash-linear-attention's calling
conventions.

    import sys; sys.path.insert(0, "<repo>/python")
    import mixbench_ops as mb
    o, ht = mb.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)

The operators live in libmixbench_torch_ops.so (CMake target mixbench_torch_ops, built with the rest of
the project). load() finds it: $MIXBENCH_TORCH_OPS_LIB when set, else the most recently built
build*/libmixbench_torch_ops.so of this repository; torch.ops.load_library(path) works as well.
Every function takes CPU or CUDA tensors (the CUDA path needs a CUDA build), records autograd and
can be captured in a CUDA graph once warmed up (one call outside the capture).

Differences from flash-linear-attention (fla.ops, 0.6.0):
  * layout [B,T,H,...] only (head_first=True transposes [B,H,T,...] in and out, as FLA < 0.6 did);
    no variable-length batches (cu_seqlens), no context parallelism (cp_context), the state in
    [K,V] order only (state_v_first=False), no grouped value heads (v, g and beta have q's H);
    gates given in log space (no use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
    safe_gate, lower_bound): these raise NotImplementedError.
  * use_qk_l2norm_in_kernel normalises q and k (x / sqrt(sum x^2 + 1e-6), FLA's eps) with LibTorch
    ops before the kernels rather than inside them.
  * final_state is None unless output_final_state, as in FLA, and fp32 like FLA's for bf16, fp16 and
    fp32 inputs (fp64 for fp64 inputs); o has the inputs' dtype. scale=None is K^-0.5.
  * chunk_simple_gla: g=None and g_gamma=None means no decay (FLA requires one of them).
  * attention(q, k, v, causal=True, window=0, scale=None): causal only (causal=False raises);
    window = visible keys including the query (0 = all), i.e. flash-attn's window_size=(window-1, 0);
    flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=True, window_size=(-1, -1))
    takes flash-attn's own arguments;
    GQA when k and v have fewer heads; logit_scale_a > 1 multiplies q_t by log_a(t + a).
  * sparse_attention(q, k, v, indices, scale=None): the attention part of FLA's naive_dsa with its
    indices given, [B,T,topk] int64, -1 padded; a query with no key gets o = 0 (FLA: NaN).
  * block_sparse_attention(q, k, v, block_indices, block_size, q_block=0, scale=None): MoBA / NSA
    selection layout, block_indices [B,Hkv,ceil(T/q_block),topk] (no FLA counterpart).
  * dsa_indexer(q_idx, k_idx, w_idx=None, topk=2048, scale=None, activation=None): FLA's
    naive_dsa_indexer (activation None or 'relu'); ties go to the lowest key index.
  * On CUDA tensors the sparse operators check index shapes but not values (reading them would
    synchronise with the device); on CPU tensors out-of-range or non-causal indices raise ValueError.
"""
import glob
import os

import torch

LIBRARY = "libmixbench_torch_ops.so"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_loaded = None


def library_path():
    """$MIXBENCH_TORCH_OPS_LIB, else the newest <repo>/build*/libmixbench_torch_ops.so."""
    env = os.environ.get("MIXBENCH_TORCH_OPS_LIB")
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError(f"MIXBENCH_TORCH_OPS_LIB={env}: no such file")
        return env
    found = glob.glob(os.path.join(ROOT, "build*", LIBRARY))
    if not found:
        raise FileNotFoundError(f"{LIBRARY} not found in {os.path.join(ROOT, 'build*')}: build the CMake target "
                                "mixbench_torch_ops (ci/setup.sh builds it) or set MIXBENCH_TORCH_OPS_LIB")
    return max(found, key=os.path.getmtime)


def load(path=None):
    """Loads the operators once (torch.ops.load_library) and returns the library's path."""
    global _loaded
    if _loaded is None:
        path = path or library_path()
        torch.ops.load_library(path)
        _loaded = path
    return _loaded


def ops():
    load()
    return torch.ops.mixbench


_UNSUPPORTED = {"cu_seqlens": None, "cu_seqlens_cpu": None, "cp_context": None, "state_v_first": False,
                "use_gate_in_kernel": False, "use_beta_sigmoid_in_kernel": False, "allow_neg_eigval": False,
                "safe_gate": False, "lower_bound": None, "chunk_indices": None}


def _refuse(fn, kwargs):
    for name, value in kwargs.items():
        if name not in _UNSUPPORTED:
            raise TypeError(f"{fn}() got an unexpected keyword argument '{name}'")
        if value is not None and value is not False and value != _UNSUPPORTED[name]:
            raise NotImplementedError(f"mixbench_ops.{fn}: {name}={value!r} is not supported (see the module's notes)")


def _bthd(x, head_first):
    return x.transpose(1, 2) if (head_first and x is not None) else x


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                     head_first=False, **kwargs):
    _refuse("chunk_simple_gla", kwargs)
    q, k, v, g = (_bthd(x, head_first) for x in (q, k, v, g))
    o, ht = ops().simple_gla(q, k, v, g, g_gamma, scale, initial_state, output_final_state)
    return _bthd(o, head_first), (ht if output_final_state else None)


def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, head_first=False, **kwargs):
    _refuse("chunk_gla", kwargs)
    q, k, v, g = (_bthd(x, head_first) for x in (q, k, v, g))
    o, ht = ops().gla(q, k, v, g, scale, initial_state, output_final_state)
    return _bthd(o, head_first), (ht if output_final_state else None)


def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                     use_qk_l2norm_in_kernel=False, head_first=False, **kwargs):
    _refuse("chunk_delta_rule", kwargs)
    q, k, v, beta = (_bthd(x, head_first) for x in (q, k, v, beta))
    o, ht = ops().delta_rule(q, k, v, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel)
    return _bthd(o, head_first), (ht if output_final_state else None)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, head_first=False, **kwargs):
    _refuse("chunk_gated_delta_rule", kwargs)
    q, k, v, g, beta = (_bthd(x, head_first) for x in (q, k, v, g, beta))
    o, ht = ops().gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state,
                                   use_qk_l2norm_in_kernel)
    return _bthd(o, head_first), (ht if output_final_state else None)


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, head_first=False, **kwargs):
    _refuse("chunk_kda", kwargs)
    q, k, v, g, beta = (_bthd(x, head_first) for x in (q, k, v, g, beta))
    o, ht = ops().kda(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel)
    return _bthd(o, head_first), (ht if output_final_state else None)


def attention(q, k, v, causal=True, window=0, scale=None, logit_scale_a=0.0):
    return ops().attention(q, k, v, causal, window, scale, logit_scale_a)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1)):
    """flash-attn's call: window_size=(left, right) with right 0 (or -1 under causal) and left -1 (all
    keys) or the number of keys before the query; causal=True only, no dropout."""
    if dropout_p:
        raise NotImplementedError("mixbench_ops.flash_attn_func: dropout_p must be 0")
    if not causal:
        raise NotImplementedError("mixbench_ops.flash_attn_func: only causal=True is implemented")
    left, right = window_size
    if right not in (-1, 0) or left < -1:
        raise NotImplementedError(f"mixbench_ops.flash_attn_func: window_size={window_size} (causal: (left, 0))")
    return attention(q, k, v, True, 0 if left < 0 else left + 1, softmax_scale)


def sparse_attention(q, k, v, indices, scale=None):
    return ops().sparse_attention(q, k, v, indices, scale)


def block_sparse_attention(q, k, v, block_indices, block_size, q_block=0, scale=None):
    return ops().block_sparse_attention(q, k, v, block_indices, block_size, q_block, scale)


def dsa_indexer(q_idx, k_idx, w_idx=None, topk=2048, scale=None, activation=None, **kwargs):
    _refuse("dsa_indexer", kwargs)
    return ops().dsa_indexer(q_idx, k_idx, w_idx, topk, scale, activation)


# fla.ops's names for the same calls
naive_dsa_indexer = dsa_indexer

__all__ = ["LIBRARY", "library_path", "load", "ops", "chunk_simple_gla", "chunk_gla", "chunk_delta_rule",
           "chunk_gated_delta_rule", "chunk_kda", "attention", "flash_attn_func", "sparse_attention", "block_sparse_attention",
           "dsa_indexer", "naive_dsa_indexer"]
