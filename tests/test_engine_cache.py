"""The fixed batch's KV stores on their own: the seats as one fixed batch (engine/attention.py
`BatchKV` over a SeatPool) and the lab's growing cache (lab/kitchens.py `GrowingPass`) keep the same
keys and give the same attention, packed writes land in the right rows, compaction keeps the right
rows, and the byte counts are what the shapes say."""

import torch

from engine.attention import BatchKV, additive_bias
from engine.config import ModelConfig
from engine.kv_pool import SeatPool
from lab.kitchens import GrowingKV, GrowingPass, keep_seats

L, B, H, D = 2, 3, 2, 4  # layers, rows, KV heads, head dim
CFG = ModelConfig("llama", vocab_size=16, d_model=H * D, n_layers=L, n_heads=H, n_kv_heads=H, head_dim=D,
                  ffn_dim=16, max_context=32)  # fmt: skip


def kv(T, seed, rows=B):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(rows, H, T, D, generator=g) for _ in range(3))  # q, k, v (B, H, T, D)


def test_seats_and_growing_keep_the_same_keys_and_attend_alike():
    pool, growing = SeatPool(CFG, B, 10, torch.float32, "cpu"), GrowingKV(L)
    q, k, v = kv(5, 0)
    for layer in range(L):
        ours = BatchKV(pool, torch.arange(5)).attend(layer, q, k, v)  # a fresh causal pass, written
        theirs = GrowingPass(growing).attend(layer, q, k, v)
        assert torch.equal(ours, theirs) and ours.shape == (B, 5, H * D)
    for step in range(3):
        q1, k1, v1 = kv(1, step + 1)
        slot = 5 + step
        bias = additive_bias(torch.ones(B, 1, 1, slot + 1, dtype=torch.bool), torch.float32)  # (B, 1, 1, S)
        ours = BatchKV(pool, torch.tensor([slot]), bias).attend(0, q1, k1, v1)
        theirs = GrowingPass(growing, bias).attend(0, q1, k1, v1)
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
        assert torch.equal(pool.k_layer[0][:, :, : slot + 1], growing.k[0])
        assert torch.equal(pool.v_layer[0][:, :, : slot + 1], growing.v[0])
    assert pool.bytes_reserved == 2 * L * B * H * 10 * D * 4  # preallocated once
    assert growing.bytes_allocated == 2 * B * H * D * 4 * (8 + 5)  # layer 0 grew to 8, layer 1 stayed at 5
    assert growing.peak_bytes == growing.bytes_allocated


def test_packed_write_scatters_each_sequence_into_its_row():
    lengths = [3, 1, 2]
    k = torch.arange(sum(lengths) * H * D, dtype=torch.float32).view(1, H, sum(lengths), D)
    pool, growing = SeatPool(CFG, B, 8, torch.float32, "cpu"), GrowingKV(L)
    ours = BatchKV(pool, packed=lengths).attend(0, k, k, k)
    theirs = GrowingPass(growing, packed=lengths).attend(0, k, k, k)
    assert torch.equal(ours, theirs) and ours.shape == (1, sum(lengths), H * D)
    for store_k, store_v in ((pool.k_layer[0], pool.v_layer[0]), (growing.k[0], growing.v[0])):
        assert torch.equal(store_k[0, :, :3], k[0, :, 0:3])
        assert torch.equal(store_k[1, :, :1], k[0, :, 3:4])
        assert torch.equal(store_v[2, :, :2], k[0, :, 4:6])
    assert growing.k[0].shape == (B, H, 3, D)  # rows as long as the longest sequence


def test_compaction_keeps_the_chosen_rows_in_order():
    pool, growing = SeatPool(CFG, B, 6, torch.float32, "cpu"), GrowingKV(L)
    q, k, v = kv(4, 3)
    for layer in range(L):
        BatchKV(pool, torch.arange(4)).attend(layer, q, k, v)
        GrowingPass(growing).attend(layer, q, k, v)
    rows = torch.tensor([2, 0])
    keep_seats(pool, rows)
    growing.keep_rows(rows)
    assert torch.equal(pool.k_layer[1][0, :, :4], k[2]) and torch.equal(pool.v_layer[0][1, :, :4], v[0])
    assert torch.equal(growing.k[1][0], k[2]) and torch.equal(growing.v[0][1], v[0])
    assert growing.bytes_allocated == 2 * L * 2 * H * 4 * D * 4  # the dropped row's bytes are gone
