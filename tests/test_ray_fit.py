"""What an executor's Ray actor asks for, fitted to the cluster's nodes,
and an infeasible request named (app/runtime/ray_fit.py; no Ray needed)."""

from __future__ import annotations

from app.runtime.devices import ExecutorDevice
from app.runtime.ray_fit import describe, fitted, infeasible, offers_of, request_of

ONE_CPU = {
    "NodeID": "a" * 56,
    "NodeManagerAddress": "10.0.0.1",
    "Alive": True,
    "Resources": {"CPU": 1.0, "memory": 1e9},
}
THREE_CPU = {
    "NodeID": "b" * 56,
    "NodeManagerAddress": "10.0.0.2",
    "Alive": True,
    "Resources": {"CPU": 3.0},
}
DEAD = {
    "NodeID": "c" * 56,
    "NodeManagerAddress": "10.0.0.3",
    "Alive": False,
    "Resources": {"CPU": 64.0, "GPU": 8.0},
}
CPU4 = ExecutorDevice(0, "cpu", "cpu:0", threads=4)
GPU = ExecutorDevice(1, "cuda", "cuda:0")
EMU = ExecutorDevice(2, "emulated", "emulated:0")


def test_a_cpu_slice_is_fitted_to_the_largest_live_node_it_may_run_on():
    offers = offers_of([ONE_CPU, THREE_CPU, DEAD])
    assert [o.node_id[0] for o in offers] == ["a", "b"]  # the dead node offers nothing
    assert fitted(CPU4, offers, None).threads == 3
    assert fitted(CPU4, offers, "a" * 56).threads == 1  # its RAY_NODES node
    small = ExecutorDevice(0, "cpu", "cpu:0", threads=2)
    assert fitted(small, offers, None) is small  # fits already
    assert fitted(GPU, offers, None) is GPU and fitted(EMU, offers, None) is EMU
    assert request_of(fitted(CPU4, offers, None)) == {"CPU": 3.0}
    assert request_of(GPU) == {"GPU": 1.0}
    assert request_of(EMU) == {"CPU": 0.0}
    assert describe(request_of(EMU)) == "no CPU or GPU"


def test_an_infeasible_request_names_the_executor_what_it_asks_and_what_each_node_offers():
    offers = offers_of([ONE_CPU, THREE_CPU])
    assert infeasible(CPU4, {"CPU": 3.0}, offers, None, fitted_threads=True) is None
    assert infeasible(EMU, request_of(EMU), offers, None, fitted_threads=True) is None
    text = infeasible(CPU4, {"CPU": 4.0}, offers, None, fitted_threads=False)
    assert text is not None
    assert text.startswith("executor cpu:0: its Ray actor asks for 4 CPU (THREADS_PER_SLICE")
    assert "more than any live node has" in text
    assert "node aaaaaaaaaaaa… at 10.0.0.1: 1 CPU, 0 GPU" in text
    assert "node bbbbbbbbbbbb… at 10.0.0.2: 3 CPU, 0 GPU" in text
    pinned = infeasible(CPU4, {"CPU": 3.0}, offers, "a" * 56, fitted_threads=True)
    assert pinned is not None and "more than its RAY_NODES node has" in pinned
    gpu = infeasible(GPU, request_of(GPU), offers, None, fitted_threads=True)
    assert gpu is not None and "asks for 1 GPU" in gpu
    none = infeasible(CPU4, {"CPU": 1.0}, [], None, fitted_threads=True)
    assert none is not None and "(no live nodes)" in none
