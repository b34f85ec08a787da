"""How a TorchScript module's tensors map to its model config's, and where
the module can be cut into stages (app/runtime/torch_backend.py runs them).

Inputs. `forward` takes the config's inputs either

* positionally, in the config's input order: `forward(a, b)` gets the
  tensors of `inputs[0]` and `inputs[1]`, whatever forward names its
  arguments (TorchScript keeps no other link between the two); or
* as one `Dict[str, Tensor]` keyed by input name (`forward(inputs)`).

Outputs. `forward` returns one tensor (a config with one output), a tuple
or list of tensors (the config's outputs in order, exactly as many), or a
`Dict[str, Tensor]` keyed by output name (every output the config declares;
keys it does not declare are not served, and are logged at load).

Stages. Exit points sit between *layers*, units that take one tensor and
return one, so that a stage boundary is a single tensor:

* an `nn.Sequential` (one input): its top-level children;
* a *chain*, a module whose forward only calls its own children one after
  another, the first on forward's arguments (any number of them, in
  order) and each next one on the previous one's tensor, returning the
  last one's result (read from the TorchScript graph, so the check is
  exact): the first child is the *head* that takes the inputs; after it
  one tensor flows, and the children that follow are the layers (the
  children of a Sequential among them too);
* anything else: with one input, the whole module is one layer; with
  several inputs or a dict, the whole module is the head and there are no
  layers: it runs unstaged, stoppable only before it starts (a logged note
  says so).

A head runs from Python with an exit point after it (when layers follow).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.repository.config import ModelConfig, TensorSpec

log = logging.getLogger("app.runtime.torch_backend")


@dataclass
class Structure:
    """What the torch backend runs: `head` (None, or a module taking the
    config's inputs: positionally, or one dict when `dict_input`), then
    `layers` (one tensor in, one out), the units exit points go between."""

    dict_input: bool
    head: Any
    layers: list[Any]
    kind: str  # "sequential" | "chain" | "module" (how it was read, for the log)

    @property
    def staged(self) -> bool:
        return len(self.layers) > 1 or (self.head is not None and bool(self.layers))


def forward_arguments(module: Any) -> list[tuple[str, str, bool]]:
    """forward's arguments after self: (name, type, has a default)."""
    schema = module.forward.schema
    return [(a.name, str(a.type), a.default_value is not None) for a in schema.arguments[1:]]


def takes_dict(module: Any, config: ModelConfig) -> bool:
    """Whether forward takes one Dict[str, Tensor] (else the config's inputs
    positionally); a ValueError when its arguments cannot take them."""
    args = forward_arguments(module)
    names = [spec.name for spec in config.inputs]
    if len(args) == 1 and args[0][1].replace(" ", "") in ("Dict(str,Tensor)", "Dict[str,Tensor]"):
        return True
    required = sum(1 for _, _, has_default in args if not has_default)
    if not required <= len(names) <= len(args):
        shown = ", ".join(f"{n}: {t}" for n, t, _ in args)
        raise ValueError(
            f"model {config.name!r}: forward({shown}) takes {required}"
            + (f" to {len(args)}" if len(args) != required else "")
            + f" tensors, the config declares {len(names)} inputs {names} "
            "(matched by position, in the config's order)"
        )
    for (arg, typ, _), name in zip(args, names, strict=False):
        if typ != "Tensor":
            raise ValueError(
                f"model {config.name!r}: input {name!r} goes to forward's argument "
                f"{arg!r}, which takes {typ}, not a Tensor"
            )
    return False


def chain_children(module: Any) -> list[Any] | None:
    """The children a chain module calls, in order (see the module
    docstring), or None when forward is anything else."""
    graph = module.graph
    # Graph values compared by their names (unique within a graph).
    inputs = [v.debugName() for v in graph.inputs()]
    self_value, args = inputs[0], inputs[1:]
    children: dict[str, Any] = {}  # graph value → child module
    calls: list[Any] = []
    for node in graph.nodes():
        kind = node.kind()
        if kind == "prim::GetAttr":
            (source,) = [v.debugName() for v in node.inputs()]
            child = getattr(module, node.s("name"), None) if source == self_value else None
            if child is None or not hasattr(child, "forward"):
                return None  # a parameter, a buffer or a grandchild: not a chain
            children[node.output().debugName()] = child
        elif kind == "prim::CallMethod" and node.s("name") == "forward":
            calls.append(node)
        else:
            return None
    if not calls:
        return None
    layers = []
    flowing = args  # what the next call must take, exactly
    for i, call in enumerate(calls):
        target, *call_args = [v.debugName() for v in call.inputs()]
        if target not in children or call_args != flowing:
            return None
        out = call.output()
        if i < len(calls) - 1 and str(out.type()) != "Tensor":
            return None  # more than one tensor would flow between stages
        layers.append(children[target])
        flowing = [out.debugName()]
    return layers if [v.debugName() for v in graph.outputs()] == flowing else None


def structure(module: Any, config: ModelConfig) -> Structure:
    """Read the module as the module docstring says."""
    dict_input = takes_dict(module, config)
    several = len(config.inputs) > 1
    name = getattr(module, "original_name", type(module).__name__)
    if dict_input:
        found = Structure(True, module, [], "module")
    elif name == "Sequential" and not several:
        found = Structure(False, None, list(module.children()) or [module], "sequential")
    else:
        chain = chain_children(module)
        if chain is not None:
            # A Sequential child's own children are layers too.
            chain = chain[:1] + [layer for child in chain[1:] for layer in _unrolled(child)]
        if chain is not None and len(chain) > 1:
            head = chain[0] if several else None
            found = Structure(False, head, chain[1:] if several else chain, "chain")
        elif several:
            found = Structure(False, module, [], "module")
        else:
            found = Structure(False, None, [module], "module")
    if found.head is not None and not found.layers:
        log.info(
            "model %r: %s; it runs unstaged (no exit point: a stop waits for the batch to end)",
            config.name,
            "forward takes a dict of inputs"
            if dict_input
            else f"forward takes {len(config.inputs)} inputs and is not a chain of "
            "modules after which one tensor flows",
        )
    return found


def _unrolled(module: Any) -> list[Any]:
    if getattr(module, "original_name", "") == "Sequential":
        return list(module.children()) or [module]
    return [module]


def named_outputs(result: Any, config: ModelConfig) -> dict[str, Any]:
    """forward's result keyed by the config's output names (see the module
    docstring); a ValueError naming what does not fit."""
    names = [spec.name for spec in config.outputs]
    if isinstance(result, dict):
        missing = [n for n in names if n not in result]
        if missing:
            raise ValueError(
                f"model {config.name!r}: forward returned no output {missing[0]!r} "
                f"(it returned {sorted(result)})"
            )
        return {n: result[n] for n in names}
    values = list(result) if isinstance(result, tuple | list) else [result]
    if len(values) != len(names):
        raise ValueError(
            f"model {config.name!r}: forward returned {len(values)} tensors, the config "
            f"declares {len(names)} outputs {names} (matched by position)"
        )
    return dict(zip(names, values, strict=True))


def extra_outputs(result: Any, config: ModelConfig) -> list[str]:
    """Keys of a dict result that the config does not declare."""
    if not isinstance(result, dict):
        return []
    return sorted(set(result) - {spec.name for spec in config.outputs})


def check_output(config: ModelConfig, spec: TensorSpec, value: Any, batch: int) -> None:
    """A ValueError naming the output when the dry run's value does not
    have the config's datatype and shape (a -1 matches any size)."""
    if not hasattr(value, "numpy"):
        raise ValueError(
            f"model {config.name!r}: output {spec.name!r} is a {type(value).__name__}, not a tensor"
        )
    dtype = str(value.dtype).removeprefix("torch.")
    try:
        got = value.detach().to("cpu").numpy().dtype
    except TypeError:  # bfloat16 and other types numpy has not
        got = None
    if got != spec.dtype:
        raise ValueError(
            f"model {config.name!r}: output {spec.name!r} is {dtype}, "
            f"the config says {spec.datatype} ({spec.dtype})"
        )
    shape = tuple(value.shape)
    want = (batch, *spec.item_shape)
    if len(shape) != len(want) or any(w not in (-1, s) for w, s in zip(want, shape, strict=True)):
        raise ValueError(
            f"model {config.name!r}: output {spec.name!r} has shape {list(shape)} for a "
            f"batch of {batch}, the config says {list(spec.shape)}"
        )


def sample_inputs(config: ModelConfig, batch: int, zeros: bool = False) -> list[np.ndarray]:
    """Arrays of the config's input datatypes and shapes (a -1 dimension
    taken as 1): zeros, or random normal values for float inputs."""
    rng = np.random.default_rng(0)
    out = []
    for spec in config.inputs:
        shape = (batch, *(1 if d < 0 else d for d in spec.item_shape))
        if zeros or spec.dtype.kind != "f":
            out.append(np.zeros(shape, dtype=spec.dtype))
        else:
            out.append(rng.standard_normal(shape).astype(spec.dtype))
    return out
