"""Graph.producers() / users() are made once per node list and shared (ir/graph.py _index):
they must be rebuilt whenever the list holds other nodes, and must equal maps built from
scratch by walking the nodes."""
from __future__ import annotations

from rockjit.ir import Builder, DType, Graph, Node, Op, TensorType

F32 = TensorType(DType.F32, (2, 3))


def _graph() -> Graph:
    b = Builder("g")
    x = b.input(F32)
    y = b.add(Op.ADD, [x, x])
    z = b.add(Op.MUL, [y, x])
    return b.finish([z])


def _fresh(g: Graph) -> tuple[dict, dict]:
    producers = {v.id: n for n in g.nodes for v in n.outputs}
    users: dict = {}
    for n in g.nodes:
        for v in n.inputs:
            users.setdefault(v.id, []).append(n)
    return producers, users


def _same(a: dict, b: dict) -> bool:
    """Equal keys and the very same node objects (identity, not Node.__eq__)."""
    def ids(m: dict) -> dict:
        return {k: [id(n) for n in (v if isinstance(v, list) else [v])] for k, v in m.items()}
    return ids(a) == ids(b)


def test_maps_match_a_walk_and_are_shared_while_the_nodes_stay() -> None:
    g = _graph()
    p, u = _fresh(g)
    assert _same(g.producers(), p) and _same(g.users(), u)
    assert g.producers() is g.producers() and g.users() is g.users()


def test_an_appended_node_is_seen() -> None:
    g = _graph()
    before = g.users()
    z = g.nodes[-1].out
    w = Node(Op.ADD, (z, z), (type(z)(99, F32),))
    g.nodes.append(w)
    assert _same(g.users(), _fresh(g)[1]) and g.users() is not before
    assert g.producers()[99] is w


def test_a_node_replaced_by_an_equal_one_is_seen() -> None:
    """An equal (Node.__eq__) but distinct node object: the maps must hand out the new one."""
    g = _graph()
    old = g.nodes[0]
    g.producers()
    new = Node(old.op, old.inputs, old.outputs, dict(old.attrs), old.loc)
    assert new == old and new is not old
    g.nodes[0] = new
    assert g.producers()[old.out.id] is new
    assert all(n is not old for us in g.users().values() for n in us)


def test_a_removed_node_is_gone() -> None:
    g = _graph()
    g.users()
    last = g.nodes.pop()
    assert last.out.id not in g.producers()
    assert _same(g.users(), _fresh(g)[1])
