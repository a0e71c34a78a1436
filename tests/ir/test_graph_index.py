"""Graph.producers()/users() are indexed once per node list (graph.py ``_index``): the index
must follow every change of ``nodes`` and never leak a caller's edits into the next answer."""
from __future__ import annotations

from rockjit.ir import Builder, DType, Graph, Node, Op, TensorType


def _reference(g: Graph) -> tuple[dict, dict]:
    """The index written out independently (what the methods meant before the memo)."""
    prod = {v.id: n for n in g.nodes for v in n.outputs}
    users: dict = {}
    for n in g.nodes:
        for v in n.inputs:
            users.setdefault(v.id, []).append(n)
    return prod, users


def _same(a: dict, b: dict) -> bool:
    """Equal keys, and the very same node objects (identity) in the same order."""
    def ids(d: dict) -> dict:
        return {k: [id(x) for x in (v if isinstance(v, list) else [v])] for k, v in d.items()}
    return ids(a) == ids(b)


def _graph() -> Graph:
    t = TensorType(DType.F32, (2, 3))
    b = Builder()
    x = b.input(t)
    y = b.add(Op.ADD, (x, x))
    z = b.add(Op.MUL, (y, x))
    return b.finish((z,))


def test_index_follows_every_change_of_the_node_list() -> None:
    g = _graph()
    assert _same(g.producers(), _reference(g)[0]) and _same(g.users(), _reference(g)[1])
    first = g.producers()
    # appended: a new user of the last value
    last = g.nodes[-1]
    extra = Node(Op.ADD, (last.out, last.out), (type(last.out)(99, last.out.type),))
    g.nodes.append(extra)
    assert 99 in g.producers() and extra in g.users()[last.out.id]
    assert _same(g.producers(), _reference(g)[0]) and _same(g.users(), _reference(g)[1])
    # replaced in place by an equal but distinct node: the index holds the new object
    twin = Node(last.op, last.inputs, last.outputs, dict(last.attrs), last.loc)
    assert twin == last and twin is not last
    g.nodes[-2] = twin
    assert g.producers()[last.out.id] is twin
    assert _same(g.users(), _reference(g)[1])
    # a whole new list (a pass's rewrite)
    g.nodes = g.nodes[:1]
    assert _same(g.producers(), _reference(g)[0]) and _same(g.users(), _reference(g)[1])
    assert last.out.id in first and last.out.id not in g.producers()


def test_a_callers_edits_do_not_reach_the_next_answer() -> None:
    g = _graph()
    p, u = g.producers(), g.users()
    p.clear()
    for ns in u.values():
        ns.clear()
    u[12345] = []
    assert _same(g.producers(), _reference(g)[0]) and _same(g.users(), _reference(g)[1])
