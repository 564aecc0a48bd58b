import torch

from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.draft import KVCache
from dspark_compile.draft import HostPath
from dspark_compile.tools.rounds import synthetic_rounds


def test_host_path_counts_its_traffic(device):
    lane = lane_config("tiny_d2t")
    R, k, V = 4, lane.k, lane.draft_vocab_size
    drafter = random_drafter(lane, device)
    inputs = next(synthetic_rounds(lane, R, 20, 1, 0, device))
    result = HostPath(drafter).draft(KVCache.allocate(lane, R, device, 64), inputs)
    # down: f32 base logits, the anchors, k f32 bias rows, the confidences
    assert result.transfers.d2h_bytes == R * k * V * 4 + R * 8 + k * R * V * 4 + R * k * 4
    # up: prev for each step, then all prevs once for the confidences
    assert result.transfers.h2d_bytes == k * R * 8 + R * k * 8
    assert result.transfers.syncs == 1 + 1 + k + 1
    assert result.ids.device.type == "cpu" and result.ids.shape == (R, k)


def test_host_path_breaks_ties_to_the_lowest_index(device):
    lane = lane_config("tiny", k=1)
    drafter = random_drafter(lane, device)
    with torch.no_grad():  # every logit equal: argmax must pick draft id 0
        drafter.lm_head.weight.zero_()
        drafter.markov_head.markov_w2.weight.zero_()
    inputs = next(synthetic_rounds(lane, 2, 8, 1, 0, device))
    result = HostPath(drafter).draft(KVCache.allocate(lane, 2, device, 16), inputs)
    assert result.ids.tolist() == [[0], [0]]
