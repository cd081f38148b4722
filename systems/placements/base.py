"""The Placement interface: which GPU may hold, and which runs, each expert (docs/gpus.md).

With `hardware.num_gpus` GPUs, each has its own expert cache, its own copy engine on its own
host link and its own instance of the system (harness/sim/step_gpus.py). A placement says,
for every expert key (layer * num_experts + expert id), the GPUs that may cache it
(`owners`), and which of them runs it for a token whose hidden state lives on GPU `home`
(`runs_on`): the home GPU when it is an owner, else the key's first owner, to which the
token is sent and from which its output comes back (the all-to-all, both ways). Request r's
tokens live on GPU r % num_gpus (the dense part is replicated on every GPU, data parallel).

A placement is pure Python over keys, like the zoo's evictors and prefetchers; it is chosen
as the config group `placement` and applies to any system. On one GPU every placement puts
every expert there, so a run is the single-GPU run (tests/sim/test_gpus.py).
"""

from __future__ import annotations

from core.knobs import KnobError


class Placement:
    name = "base"

    def needs_calibration(self) -> bool:
        """True: the runner loads the calibration split and calls `fit` before `bind`."""
        return False

    def fit(self, calibration) -> None:
        """A placement that reads activation counts takes them from the calibration split."""

    def check(self, num_gpus: int, num_layers: int, num_experts: int) -> None:
        """Refuse a GPU count this placement cannot use (KnobError naming the key)."""

    def bind(self, num_gpus: int, num_layers: int, num_experts: int,
             capacity_slots: int) -> None:
        """Fix every key's owners (a tuple of GPU ids, ascending) for the run; one GPU's
        cache holds `capacity_slots` experts."""
        self.check(num_gpus, num_layers, num_experts)
        self.num_gpus, self.num_experts = num_gpus, num_experts
        self.owners = [self.owners_of(layer, e, num_gpus, num_layers, num_experts)
                       for layer in range(num_layers) for e in range(num_experts)]

    def owners_of(self, layer: int, expert: int, num_gpus: int, num_layers: int,
                  num_experts: int) -> tuple[int, ...]:
        raise NotImplementedError

    def most_keys(self, num_gpus: int, num_layers: int, num_experts: int,
                  capacity_slots: int) -> int:
        """The most keys one GPU may hold (before `bind`): what a system that keeps every
        expert resident needs a GPU's cache to hold."""
        held = [0] * num_gpus
        for layer in range(num_layers):
            for e in range(num_experts):
                for g in self.owners_of(layer, e, num_gpus, num_layers, num_experts):
                    held[g] += 1
        return max(held)

    def home(self, request: int) -> int:
        """The GPU that holds request `request`'s hidden states (and runs its dense part)."""
        return request % self.num_gpus

    def runs_on(self, key: int, home: int) -> int:
        owners = self.owners[key]
        return home if home in owners else owners[0]

    def describe(self) -> dict:
        return {"name": self.name}


def placement_name(node: dict) -> str:
    """The name of a placement's config node: its `_target_`'s module
    (systems.placements.<name>.<Class>)."""
    return node["_target_"].rsplit(".", 2)[-2]


def contiguous(index: int, count: int, num_gpus: int) -> int:
    """GPU of item `index` of `count` cut into `num_gpus` contiguous blocks (sizes differ by
    one at most), as expert-parallel ranks hold experts [r E / N, (r + 1) E / N)."""
    return index * num_gpus // count


def at_most(num_gpus: int, items: int, what: str, name: str) -> None:
    if num_gpus > items:
        raise KnobError(f"placement: {name} gives each GPU whole {what}; {num_gpus} GPUs for "
                        f"{items} {what} leave {num_gpus - items} GPU(s) with none (use at "
                        f"most {items} GPUs, or another placement)")
