"""Run by test_loader_distributed.py under `torchrun --nproc_per_node=2`: trains a tiny model with DDP
(gloo, CPU) on an mmdata store for a few steps and writes, from rank 0, the sample ids every rank saw."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

import mmdata

STEPS = 4


def main(store: str, output: str) -> None:
    dist.init_process_group("gloo")
    spec = mmdata.Windows(
        anchor_fps=10,
        streams={"state": mmdata.Values(offsets=[-0.1, 0.0]), "action": mmdata.Values(offsets=[0.0])},
    )
    loader = mmdata.DataLoader(store, spec, batch_size=4, num_workers=1, seed=5)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(28, 14))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for step, batch in enumerate(loader):
        prediction = model(batch["state"].reshape(len(batch["state"]), -1))
        loss = torch.nn.functional.mse_loss(prediction, batch["action"][:, 0])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        seen.append(batch["sample_index"])
        if step + 1 == STEPS:
            break
    local = torch.cat(seen)
    gathered = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    if dist.get_rank() == 0:
        report = {
            "world_size": loader.world_size,
            "ranks": [ids.tolist() for ids in gathered],
            "loss": float(loss),
        }
        with open(output, "w") as handle:
            json.dump(report, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
