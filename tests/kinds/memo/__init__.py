"""A kind that exists only in tests: notes pinned on an in-memory board.

It shows what adding a kind costs: one package shaped like the shipped kinds' (``actions/kinds/<kind>/``)
and one registry line, ``register(MemoKind())``. Nothing in the engine, the services or the pages
knows it (``tests/kinds/test_a_new_kind.py`` greps the app code for its name).

- ``contract``: the ``MemoKind``: its name, explanations and id, what it binds (nothing).
- ``adapter``: its receiver, the ``Board``, which keeps keys for ever and can be looked up.
- ``checks``: the proposal's checks, each a named step.
- ``proposal``: its proposal service, recording through ``actions.services.proposal_record``.
"""
