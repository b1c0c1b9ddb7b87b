"""Backward on a thread of its own, as autograd runs it for CUDA tensors: on a device thread whose
Python stack holds none of the user's frames, with the calling thread's dispatch modes carried
over (torch propagates them), while the calling thread waits. Only the thread is simulated: the
operations, the autograd engine and the engine's recorder are the real ones.

Not in a project folder: its frames are not the user's, as autograd's are not.
"""

from __future__ import annotations

import threading

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode, _push_mode


def backward_in_a_bare_thread(loss: torch.Tensor) -> None:
    modes = _get_current_dispatch_mode_stack()
    failures: list[BaseException] = []

    def run() -> None:
        for mode in modes:
            _push_mode(mode)
        try:
            torch.autograd.backward(loss)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
            failures.append(exc)
        finally:
            for _ in modes:
                _pop_mode()

    thread = threading.Thread(target=run, name="autograd-device-thread")
    thread.start()
    thread.join()
    if failures:
        raise failures[0]
