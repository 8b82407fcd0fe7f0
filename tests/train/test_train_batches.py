import numpy as np
import torch

from gptrain.train.batches import GPTBatchDataset, ResumableMicroBatchSampler, build_loader


def test_sampler_slices_each_global_microstep_by_dp_rank():
    # micro 2, dp 3: each micro-step takes 6 consecutive samples; 20 samples -> 3 full micro-steps
    per_rank = [list(ResumableMicroBatchSampler(20, 0, 2, rank, 3)) for rank in range(3)]
    assert per_rank[0] == [[0, 1], [6, 7], [12, 13]]
    assert per_rank[2] == [[4, 5], [10, 11], [16, 17]]
    assert sorted(i for batches in per_rank for b in batches for i in b) == list(range(18))
    assert len(ResumableMicroBatchSampler(20, 0, 2, 1, 3)) == 3


def test_sampler_resumes_at_consumed_samples():
    full = list(ResumableMicroBatchSampler(40, 0, 2, 1, 2))
    resumed = list(ResumableMicroBatchSampler(40, 12, 2, 1, 2))
    assert resumed == full[3:]


def test_dataset_splits_tokens_labels_and_masks_eod_inputs():
    samples = [np.array([5, 0, 7, 8, 0], dtype=np.int32)]
    item = GPTBatchDataset(samples, eod=0, eod_mask_loss=True)[0]
    assert item["tokens"].tolist() == [5, 0, 7, 8] and item["labels"].tolist() == [0, 7, 8, 0]
    assert item["tokens"].dtype == torch.int64
    assert item["loss_mask"].tolist() == [1.0, 0.0, 1.0, 1.0]
    assert GPTBatchDataset(samples, eod=0)[0]["loss_mask"].tolist() == [1.0] * 4


def test_loader_yields_microbatches_without_touching_global_rng():
    samples = [np.arange(i, i + 5) for i in range(10)]
    torch.manual_seed(0)
    expected_next = torch.rand(1)
    torch.manual_seed(0)
    loader = build_loader(GPTBatchDataset(samples), consumed_samples=4, micro_batch_size=2)
    batches = list(loader)
    assert torch.rand(1) == expected_next
    assert [b["tokens"][:, 0].tolist() for b in batches] == [[4, 5], [6, 7], [8, 9]]
