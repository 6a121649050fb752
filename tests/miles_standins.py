"""Stand-ins for the miles types t2sql's adapter touches, with miles' field names
(miles/utils/types.py Sample, miles/rollout/base_types.py GenerateFnInput). CI has no miles; the
integration test (tests/test_miles_integration.py) runs the adapter on miles' own types."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass
class Sample:
    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    prompt: Any = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: Any = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_routed_experts: Any = None
    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True)
class GenerateFnInput:
    state: Any
    sample: Sample
    sampling_params: dict
    evaluation: bool = False

    @property
    def args(self):
        return self.state.args
