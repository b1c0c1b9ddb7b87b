"""The names the analysis document uses for the parts of an iteration, and how every front end
words them. One set, imported by the engine's layers (it imports nothing but `typing`) and kept in
step with the editor's `lua/skyline/constants.lua` by tests/test_parity.py. `PeakPhase` and
`OperationPhase` are the same names as types, which the declared document uses
(analysis/document.py): mypy checks that the labels' keys are among them, and
tests/test_document_fields.py that they hold the constants and nothing else.
"""

from __future__ import annotations

from typing import Final, Literal

# Memory phases: where in the iteration the memory peak was reached (`peak_memory_phase`).
PeakPhase = Literal["forward_backward", "optimizer", "other"]
FORWARD_BACKWARD: Final = "forward_backward"
OPTIMIZER: Final = "optimizer"
OTHER: Final = "other"  # before the first forward, after an optimizer step: zero_grad, the user's own work

# Operation phases: what an operation belongs to (`operations`, and the kinds of the other tensors
# alive at the peak, `peak_memory_operation.other_tensors[].phase`). OPTIMIZER is the update:
# optimizer.step(), and work on gradients around it.
OperationPhase = Literal["forward", "backward", "optimizer"]
FORWARD: Final = "forward"
BACKWARD: Final = "backward"

PEAK_PHASE_LABELS: dict[PeakPhase, str] = {
    FORWARD_BACKWARD: "the forward and backward pass",
    OPTIMIZER: "the optimizer step",
    OTHER: "outside forward, backward and the step (zero_grad, your own code)",
}
# The forward_backward phase of an iteration without backward work (inference, evaluation).
FORWARD_ONLY_LABEL = "the forward pass"

# The other tensors at the peak, by what made them.
TENSOR_KIND_LABELS: dict[OperationPhase, str] = {
    FORWARD: "of forward outputs",
    BACKWARD: "made in backward",
    OPTIMIZER: "made in the step",
}
