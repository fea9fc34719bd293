"""Device functions of the Triton attention kernels (the general paged kernel and the decode kernel):
a tile of keys and values read through a block table, one step of the online softmax, and the
general kernel's merge of key slices."""

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


@triton.jit
def merge_slices(part_ptr, ml_ptr, first, working, BLOCK_M: tl.constexpr, D_PAD: tl.constexpr):
    """The general paged kernel's split-K merge: one (tile, head)'s output from its first `working`
    slices' partials (slots first, first + 1, ...): sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M),
    M the rows' overall max."""
    offs_d = tl.arange(0, D_PAD)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D_PAD), tl.float32)
    for s in range(working):
        slot = (first + s) * BLOCK_M + tl.arange(0, BLOCK_M)
        m_s = tl.load(ml_ptr + slot * 2)
        m_new = tl.maximum(m_i, m_s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        a_old, a_s = tl.exp(m_i - m_safe), tl.exp(m_s - m_safe)
        l_i = l_i * a_old + tl.load(ml_ptr + slot * 2 + 1) * a_s
        acc = acc * a_old[:, None] + tl.load(part_ptr + slot[:, None] * D_PAD + offs_d[None, :]) * a_s[:, None]
        m_i = m_new
    return acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]


@functools.cache
def num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count
