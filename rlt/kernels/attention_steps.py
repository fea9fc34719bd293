"""Device functions shared by the Triton attention kernels (the general paged kernel and the decode
kernel): a tile of keys and values read through a block table, one step of the online softmax."""

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def kv_tile(base, table_row_ptr, pos, key_ok, offs_d, d_ok, stride_cb, stride_co, stride_ckv, BLOCK_SIZE: tl.constexpr):
    """K and V [len(pos), D_PAD] of one head at positions pos, through the block table (masked keys
    read as 0)."""
    block = tl.load(table_row_ptr + pos // BLOCK_SIZE, mask=key_ok, other=0)
    off = block.to(tl.int64) * stride_cb + (pos % BLOCK_SIZE) * stride_co
    kv_mask = key_ok[:, None] & d_ok[None, :]
    k = tl.load(base + off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(base + stride_ckv + off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    return k, v


@triton.jit
def softmax_step(q, k, v, allowed, m_i, l_i, acc, scale, IEEE: tl.constexpr):
    """One key tile of the online softmax in float32: scores q k^T (only `allowed` [M, N] count),
    running max m_i, sum l_i and unnormalised output acc updated."""
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    else:
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
    s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
    return m_new, l_i, acc


@functools.cache
def num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count
