"""The KV cache on its own: both implementations keep the same keys, packed writes land in the right
rows, compaction keeps the right rows, and the byte counts are what the shapes say."""

import torch

from engine.cache import GrowingKVCache, StaticKVCache

L, B, H, D = 2, 3, 2, 4  # layers, rows, KV heads, head dim


def kv(T, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, T, D, generator=g), torch.randn(B, H, T, D, generator=g)


def test_static_and_growing_return_the_same_keys():
    static = StaticKVCache(L, B, H, D, 10, torch.float32, "cpu")
    growing = GrowingKVCache(L, B, H, D, torch.float32, "cpu")
    k, v = kv(5, 0)
    for layer in range(L):
        static.update(layer, torch.arange(5), k, v)
        growing.update(layer, torch.arange(5), k, v)
    for step in range(3):
        k1, v1 = kv(1, step + 1)
        ks, vs = static.update(0, torch.tensor([5 + step]), k1, v1)
        kg, vg = growing.update(0, torch.tensor([5 + step]), k1, v1)
        assert torch.equal(ks[:, :, : 6 + step], kg) and torch.equal(vs[:, :, : 6 + step], vg)
    assert static.bytes_allocated == 2 * L * B * H * 10 * D * 4  # preallocated once
    assert growing.bytes_allocated == 2 * B * H * D * 4 * (8 + 5)  # layer 0 grew to 8, layer 1 stayed at 5


def test_packed_write_scatters_each_sequence_into_its_row():
    lengths = [3, 1, 2]
    k = torch.arange(sum(lengths) * H * D, dtype=torch.float32).view(1, H, sum(lengths), D)
    for cache in (
        StaticKVCache(L, B, H, D, 8, torch.float32, "cpu"),
        GrowingKVCache(L, B, H, D, torch.float32, "cpu"),
    ):
        cache.write_packed(0, lengths, k, k)
        assert torch.equal(cache.k[0][0, :, :3], k[0, :, 0:3])
        assert torch.equal(cache.k[0][1, :, :1], k[0, :, 3:4])
        assert torch.equal(cache.v[0][2, :, :2], k[0, :, 4:6])


def test_compaction_keeps_the_chosen_rows_and_their_live_counts():
    cache = StaticKVCache(L, B, H, D, 6, torch.float32, "cpu")
    k, v = kv(4, 3)
    for layer in range(L):
        cache.update(layer, torch.arange(4), k, v)
    cache.add_live([4, 2, 3])
    assert cache.bytes_in_use == 9 * cache.bytes_per_token == 9 * 2 * L * H * D * 4
    cache.keep_rows([2, 0])
    assert cache.batch == 2 and cache.live == [3, 4]
    assert torch.equal(cache.k[1][0, :, :4], k[2]) and torch.equal(cache.v[0][1, :, :4], v[0])
    assert cache.bytes_allocated == 2 * L * 2 * H * 6 * D * 4
