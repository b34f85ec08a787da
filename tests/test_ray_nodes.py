"""RAY_NODES: executor → Ray node, by node ID or IP address (no Ray needed)."""

from __future__ import annotations

import pytest

from app.runtime.ray_nodes import NodeNotFound, resolve_nodes
from app.server.setting_parsers import RayNodes

HEAD = {"NodeID": "a" * 56, "NodeManagerAddress": "10.0.0.1", "Alive": True}
WORKER = {"NodeID": "b" * 56, "NodeManagerAddress": "10.0.0.2", "Alive": True}
DEAD = {"NodeID": "c" * 56, "NodeManagerAddress": "10.0.0.3", "Alive": False}
TWIN = {"NodeID": "d" * 56, "NodeManagerAddress": "10.0.0.2", "Alive": True}


def test_nodes_are_found_by_id_or_by_address():
    wanted = {0: "10.0.0.2", 2: "a" * 56}
    assert resolve_nodes(wanted, [HEAD, WORKER, DEAD], [0, 1, 2]) == {0: "b" * 56, 2: "a" * 56}
    assert resolve_nodes({}, [HEAD], [0]) == {}


def test_local_names_the_daemons_own_node():
    wanted = {0: "local", 1: "10.0.0.1"}
    found = resolve_nodes(wanted, [HEAD, WORKER], [0, 1], local="b" * 56)
    assert found == {0: "b" * 56, 1: "a" * 56}
    with pytest.raises(NodeNotFound, match="node 'local' is not a live node"):
        resolve_nodes({0: "local"}, [HEAD], [0])  # the daemon's node unknown


@pytest.mark.parametrize(
    ("wanted", "nodes", "message"),
    [
        ({5: "10.0.0.1"}, [HEAD], "names executor 5; the executors are [0, 1]"),
        ({0: "10.0.0.3"}, [HEAD, DEAD], "node '10.0.0.3' is not a live node"),
        ({1: "10.0.0.9"}, [], "(no live nodes)"),
        ({0: "10.0.0.2"}, [WORKER, TWIN], "2 live nodes are at 10.0.0.2"),
    ],
)
def test_a_node_that_is_not_one_live_node_is_an_error(wanted, nodes, message):
    with pytest.raises(NodeNotFound) as error:
        resolve_nodes(wanted, nodes, [0, 1])
    assert message in str(error.value)


def test_the_setting_reads_device_node_pairs_and_writes_them_back():
    parser = RayNodes()
    value = parser.parse(" 1=10.0.0.2, 0=abc ", "RAY_NODES")
    assert value == {1: "10.0.0.2", 0: "abc"}
    assert parser.show(value) == "0=abc,1=10.0.0.2"
    for bad, message in [
        ("10.0.0.2", "is not DEVICE=NODE"),
        ("x=10.0.0.2", "is not DEVICE=NODE"),
        ("0=", "is not DEVICE=NODE"),
        ("0=a,0=b", "names executor 0 twice"),
    ]:
        with pytest.raises(ValueError, match=message):
            parser.parse(bad, "RAY_NODES")
