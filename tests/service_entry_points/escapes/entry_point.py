"""The model provider starts processes that leave the worker's process group: `sleep 1000` in a
session of its own, and one started by a shell that exits at once (an orphan, as daemons make
themselves). Their ids go to `pids` next to this file. Then, when a file `hold` is there, it sleeps
(an analysis to cancel); when `crash` is there, the worker kills itself; otherwise the analysis
completes."""

import os
import signal
import subprocess
import time
from pathlib import Path

import torch
import torch.nn as nn

HERE = Path(__file__).parent


class TinyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, x):
        return self.linear(x).pow(2).mean()


def skyline_input_provider(batch_size=16):
    return (torch.randn(batch_size, 8),)


def skyline_model_provider():
    session = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    orphan = subprocess.run(
        ["sh", "-c", "sleep 1000 </dev/null >/dev/null 2>&1 & echo $!"],
        start_new_session=True,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (HERE / "pids.tmp").write_text(f"{session.pid} {orphan}\n")
    os.replace(HERE / "pids.tmp", HERE / "pids")
    if (HERE / "crash").exists():
        os.kill(os.getpid(), signal.SIGKILL)
    if (HERE / "hold").exists():
        time.sleep(600)
    return TinyModel()


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x):
        optimizer.zero_grad()
        model(x).backward()
        optimizer.step()

    return iteration
