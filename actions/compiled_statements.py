"""Statements the ORM builds once, then runs with new values: the fixed statements of the hot path.

Django compiles a queryset every time it runs: each filter is resolved against the model, each
expression cloned and resolved, the SQL assembled. For the UPDATE a claim makes on the order it
reserves on, that is about 0.3 ms of worker CPU, more than PostgreSQL spends running it, and the
dispatch path makes two such statements per action. Issue 18 asks for 5 ms of worker CPU per
action in all.

A ``CompiledUpdate`` is written with the ORM as usual, with a ``Slot`` wherever a value changes
from one run to the next. It is compiled on first use, for each database alias, and each run after
that only prepares the new values (as the column they stand for would: ``get_db_prep_value``) and
sends the same SQL. So the SQL is still Django's, for PostgreSQL or SQLite alike, and the query
is still read as a queryset. Only statements whose shape never changes belong here: the same
filters, the same columns, one table (no UPDATE that needs Django's pre-select of related rows).

A ``CompiledSelect`` does the same for a read of model rows (the batched claim's locked read of
the oldest AUTHORIZED actions: 1.1 ms of CPU a read of 6 rows with the ORM, 0.4 compiled), and
keeps one compiled statement per shape, for what Django writes into the SQL itself (a LIMIT).
``AnyOf`` and ``KeyList`` keep a list of keys out of the shape on PostgreSQL: one array parameter
instead of a placeholder per key.

A ``CompiledInsert`` is ``bulk_create`` for new rows of one model, compiled once: on PostgreSQL
Django already writes a bulk INSERT as ``SELECT * FROM UNNEST`` of one array per column, whose
text is the same for any number of rows, yet builds and compiles it at every call (0.5 ms of CPU
for the events of a batch of 6, measured below).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import NotSupportedError, connections, router, transaction
from django.db.models import BooleanField, Expression, F, Field, Model, QuerySet
from django.db.models.fields import AutoFieldMixin
from django.db.models.query import ModelIterable
from django.db.models.sql.subqueries import InsertQuery, UpdateQuery


def binds_arrays_in_binary(connection: Any) -> bool:
    """Whether an array parameter is sent in PostgreSQL's binary format (psycopg's ``%b``).

    psycopg dumps a list in Python, element by element; in the text format it also quotes and
    escapes each element (a JSON value's every quote): 0.26 ms of CPU for 12 arrays of 16
    values, against 0.09 in the binary format. Only a server-side binding cursor sends binary
    parameters (``server_side_binding``, on in console.settings); a client-side one writes every
    value into the SQL as text."""
    return connection.vendor == "postgresql" and connection.settings_dict["OPTIONS"].get("server_side_binding") is True


class Slot(Expression):
    """A value given at each run of a compiled statement, prepared as ``output_field`` prepares a
    value of its column. It compiles to one placeholder whose parameter is the slot itself, which
    ``CompiledUpdate`` replaces with the run's value."""

    def __init__(self, name: str, output_field: Field) -> None:
        super().__init__(output_field=output_field)
        self.name = name

    def as_sql(self, compiler: Any, connection: Any) -> Any:  # (sql, params), with this slot as the param
        if isinstance(self.output_field, KeyList) and binds_arrays_in_binary(connection):
            return "%b", [self]
        return "%s", [self]

    def __repr__(self) -> str:
        return f"Slot({self.name!r})"


class KeyList(Field):
    """The field of a slot that stands for a list of keys (``AnyOf``): each item is prepared as
    ``element`` prepares a value, and the list goes to the database as one array parameter."""

    def __init__(self, element: Field) -> None:
        super().__init__()
        self.element = element

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        return [self.element.get_db_prep_value(item, connection, prepared) for item in value]


class SavedValues(KeyList):
    """The field of a slot that stands for one value per row of a column being written
    (``ValueOfEachRow``): each item is prepared as ``element`` prepares a value it saves
    (``get_db_prep_save``: None is SQL NULL, a JSON column's included), and the list goes to the
    database as one array parameter."""

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        return [self.element.get_db_prep_save(item, connection) for item in value]


class AnyOf(Expression):
    """``<column> = ANY(%s::<type>[])``, a condition for ``filter()``: the keys of a ``KeyList``
    slot as one array parameter, so that the statement's text is the same for a list of any
    length (``IN (%s, %s, ...)`` has a placeholder per key, and a compiled statement would need
    one shape per length). PostgreSQL only: elsewhere, keep the ORM's ``__in``."""

    conditional = True

    def __init__(self, column: str, keys: Slot) -> None:
        super().__init__(output_field=BooleanField())
        if not isinstance(keys.output_field, KeyList):
            raise TypeError("AnyOf takes a slot whose field is a KeyList")
        self.column: Any = F(column)
        self.keys: Any = keys

    def get_source_expressions(self) -> list[Any]:
        return [self.column, self.keys]

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        self.column, self.keys = exprs

    def as_sql(self, compiler: Any, connection: Any) -> Any:  # (sql, params)
        if connection.vendor != "postgresql":
            raise NotSupportedError("column = ANY(array) is PostgreSQL's; use __in elsewhere")
        column_sql, column_params = compiler.compile(self.column)
        keys_sql, keys_params = compiler.compile(self.keys)
        element_type = self.keys.output_field.element.db_type(connection)
        return f"{column_sql} = ANY({keys_sql}::{element_type}[])", [*column_params, *keys_params]


class ValueOfEachRow(Expression):
    """``(%s::<type>[])[array_position(%s::<key type>[], <pk>)]``: for an UPDATE of several rows,
    each row's own value of a column, taken from an array of values (a ``SavedValues`` slot) by
    the position of the row's key in an array of keys (a ``KeyList`` slot, in the same order).

    ``ValuesByPrimaryKey``'s CASE has a branch per row, so its text changes with the number of
    rows; this text does not, and a ``CompiledUpdate`` can keep it. A key missing from the keys
    gets NULL: update only the rows named. PostgreSQL only."""

    def __init__(self, values: Slot, keys: Slot) -> None:
        if not isinstance(values.output_field, SavedValues) or not isinstance(keys.output_field, KeyList):
            raise TypeError("ValueOfEachRow takes a SavedValues slot and a KeyList slot")
        super().__init__(output_field=values.output_field.element)
        self.values: Any = values
        self.keys: Any = keys
        self.key = F("pk")

    def get_source_expressions(self) -> list[Any]:
        return [self.values, self.keys, self.key]

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        self.values, self.keys, self.key = exprs

    def as_sql(self, compiler: Any, connection: Any) -> Any:  # (sql, params)
        if connection.vendor != "postgresql":
            raise NotSupportedError("array_position is PostgreSQL's; use ValuesByPrimaryKey elsewhere")
        values_sql, values_params = compiler.compile(self.values)
        keys_sql, keys_params = compiler.compile(self.keys)
        key_sql, key_params = compiler.compile(self.key)
        # As Django's bulk INSERT through UNNEST: the type without its modifiers (varchar, not
        # varchar(16)), so that no value is cut to fit.
        value_type = self.values.output_field.element.db_type(connection).split("(")[0]
        key_type = self.keys.output_field.element.db_type(connection).split("(")[0]
        return (
            f"(({values_sql})::{value_type}[])[array_position(({keys_sql})::{key_type}[], {key_sql})]",
            [*values_params, *keys_params, *key_params],
        )


# What a compiled statement is, per alias: its SQL, and its parameters with slots among them.
_Compiled = tuple[str, tuple[Any, ...]]


class CompiledUpdate:
    """``build(**slots)`` returns the queryset to update and the values to set, with a ``Slot`` of
    each name in ``slots`` standing for that run's value; ``run(**values)`` returns the number of
    rows updated, as ``QuerySet.update`` does."""

    def __init__(
        self,
        model: type[Model],
        build: Callable[..., tuple[QuerySet[Any], dict[str, Any]]],
        **slots: Field,
    ) -> None:
        self.model = model
        self._build = build
        self._slots = slots
        self._compiled: dict[str, _Compiled] = {}

    def _compile(self, alias: str) -> _Compiled:
        rows, values = self._build(**{name: Slot(name, field) for name, field in self._slots.items()})
        if rows.model is not self.model:
            raise TypeError(f"a compiled update of {self.model.__name__} built a queryset of {rows.model.__name__}")
        query = rows.query.chain(UpdateQuery)
        assert isinstance(query, UpdateQuery)
        query.add_update_values(values)
        query.get_initial_alias()
        if query.get_related_updates() or query.count_active_tables() != 1:
            # A join or a parent model's columns: Django may SELECT the rows first and then
            # update them by id, with this run's values compiled into that SQL.
            raise ValueError(
                f"an update of {self.model.__name__} that is not one UPDATE of one table cannot be compiled once"
            )
        sql, params = query.get_compiler(alias).as_sql()
        found = {param.name for param in params if isinstance(param, Slot)}
        if found != set(self._slots):
            raise ValueError(f"the compiled update uses the slots {sorted(found)}, not {sorted(self._slots)}")
        return sql, tuple(params)

    def run(self, **values: Any) -> int:
        if set(values) != set(self._slots):
            raise TypeError(f"a compiled update takes {sorted(self._slots)}, not {sorted(values)}")
        alias = router.db_for_write(self.model)
        compiled = self._compiled.get(alias)
        if compiled is None:
            compiled = self._compiled[alias] = self._compile(alias)
        sql, template = compiled
        connection = connections[alias]
        params = [
            param.output_field.get_db_prep_value(values[param.name], connection)
            if isinstance(param, Slot)
            else param
            for param in template
        ]
        # As QuerySet.update: an error inside an atomic block marks it for rollback, even if
        # the caller catches it.
        with transaction.mark_for_rollback_on_error(using=alias), connection.cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.rowcount)


@dataclass(frozen=True)
class _CompiledRows:
    """A compiled SELECT of model rows, and how to turn each row it returns into an instance:
    what Django's ``ModelIterable`` works out from the compiler at every run."""

    sql: str
    params: tuple[Any, ...]
    field_names: list[str]  # the model's columns, by attname, as from_db takes them
    fields_start: int
    fields_end: int
    annotations: list[tuple[str, int]]
    converters: list[tuple[int, list[Callable[..., Any]], Any]]  # (position, functions, expression)


class CompiledSelect:
    """A SELECT of model rows, built with the ORM and compiled once per database alias and shape.

    ``build(**shape, **slots)`` returns the queryset, with a ``Slot`` of each name in ``slots``
    wherever a value changes from one run to the next; ``rows(**shape, **values)`` runs it and
    returns its model instances, loaded as the queryset loads them (``ModelIterable``: the
    columns' converters, ``from_db``, each annotation as an attribute).

    The shape is what Django writes into the SQL's text rather than into its parameters, such
    as a LIMIT: every distinct shape is compiled and kept, so a shape must take few values (a
    batch size up to a few dozen, say). Past ``max_shapes``, a new shape is compiled at every
    run, as the ORM would, rather than kept.

    ``for_update``: whether the queryset locks its rows (``select_for_update``). It then runs on
    the database for writes, as the queryset would; the build is checked against it.
    """

    def __init__(
        self,
        model: type[Model],
        build: Callable[..., QuerySet[Any]],
        *,
        shape: Sequence[str] = (),
        for_update: bool = False,
        max_shapes: int = 64,
        **slots: Field,
    ) -> None:
        self.model = model
        self._build = build
        self._shape = frozenset(shape)
        self._slots = slots
        self.for_update = for_update
        self.max_shapes = max_shapes
        self._compiled: dict[tuple[str, tuple[tuple[str, Any], ...]], _CompiledRows] = {}

    def _compile(self, alias: str, shape: dict[str, Any]) -> _CompiledRows:
        rows = self._build(**shape, **{name: Slot(name, field) for name, field in self._slots.items()})
        if rows.model is not self.model:
            raise TypeError(f"a compiled select of {self.model.__name__} built a queryset of {rows.model.__name__}")
        if rows.query.select_for_update != self.for_update:
            raise ValueError(f"a compiled select with for_update={self.for_update} built a queryset that differs")
        if (
            getattr(rows, "_prefetch_related_lookups", ())
            or getattr(rows, "_known_related_objects", {})
            or rows.query.select_related is not False
            or getattr(rows, "_iterable_class", None) is not ModelIterable
        ):
            # Only the model's own columns and its annotations are loaded: rows of other models,
            # or values() and values_list(), are not what rows() returns.
            raise ValueError("a compiled select loads one model's rows: no select_related, prefetch or values()")
        compiler = rows.query.get_compiler(alias)
        sql, params = compiler.as_sql()
        found = {param.name for param in params if isinstance(param, Slot)}
        if found != set(self._slots):
            raise ValueError(f"the compiled select uses the slots {sorted(found)}, not {sorted(self._slots)}")
        # As ModelIterable and SQLCompiler.results_iter read them once the SQL is compiled. The
        # converters are the compiling thread's connection's, kept for every thread: they depend on
        # the alias's settings only, and each is called with the running thread's connection.
        select_fields = compiler.klass_info["select_fields"]
        start, end = select_fields[0], select_fields[-1] + 1
        converters = compiler.get_converters([column[0] for column in compiler.select[: compiler.col_count]])
        return _CompiledRows(
            sql=sql,
            params=tuple(params),
            field_names=[column[0].target.attname for column in compiler.select[start:end]],
            fields_start=start,
            fields_end=end,
            annotations=list(compiler.annotation_col_map.items()),
            converters=[(position, functions, expression) for position, (functions, expression) in converters.items()],
        )

    def rows(self, **given: Any) -> list[Any]:
        if set(given) != self._shape | set(self._slots):
            raise TypeError(f"a compiled select takes {sorted(self._shape | set(self._slots))}, not {sorted(given)}")
        shape = {name: given[name] for name in self._shape}
        alias = router.db_for_write(self.model) if self.for_update else router.db_for_read(self.model)
        key = (alias, tuple(sorted(shape.items())))
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compile(alias, shape)
            if len(self._compiled) < self.max_shapes:
                self._compiled[key] = compiled
        connection = connections[alias]
        params = [
            param.output_field.get_db_prep_value(given[param.name], connection) if isinstance(param, Slot) else param
            for param in compiled.params
        ]
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, params)
            fetched = cursor.fetchall()
        instances = []
        for row in fetched:
            values = list(row)
            for position, functions, expression in compiled.converters:
                value = values[position]
                for function in functions:
                    value = function(value, expression, connection)
                values[position] = value
            columns = values[compiled.fields_start : compiled.fields_end]
            instance = self.model.from_db(alias, compiled.field_names, columns)
            for name, position in compiled.annotations:
                setattr(instance, name, values[position])
            instances.append(instance)
        return instances


class CompiledInsert:
    """``insert(objects)``: what ``Model.objects.bulk_create(objects)`` does for new rows whose
    primary key the database assigns, in one INSERT compiled once per database alias.

    Django writes that INSERT on PostgreSQL as ``INSERT ... SELECT * FROM UNNEST(%s::type[], ...)
    RETURNING pk``: one array per column, so one text for any number of rows. It is compiled here
    by Django's own compiler, once, and each call only prepares the values as the compiler would
    (``pre_save(obj, add=True)``, then ``get_db_prep_save``) and reads back the keys, in the order
    of the objects, as ``bulk_create`` does. Like ``bulk_create``, no ``save()`` and no signals.
    Elsewhere than PostgreSQL, it is ``bulk_create``.
    """

    def __init__(self, model: type[Model]) -> None:
        self.model = model
        meta = model._meta
        self.fields = [field for field in meta.concrete_fields if not field.generated and field is not meta.pk]
        self._compiled: dict[str, str] = {}

    def _compile(self, alias: str) -> str:
        meta = self.model._meta
        if not isinstance(meta.pk, AutoFieldMixin) or any(field.db_returning for field in self.fields):
            # bulk_create would also read back what the database wrote; only the key is read here.
            raise ValueError(f"a compiled insert of {self.model.__name__} reads back its database-assigned key only")
        query = InsertQuery(self.model)
        # Two blank rows: one row is written as VALUES, and only the SQL text is kept.
        query.insert_values(self.fields, [self.model(), self.model()])
        compiler = query.get_compiler(alias)
        compiler.returning_fields = [meta.pk]
        statements = compiler.as_sql()
        sql = statements[0][0]
        if len(statements) != 1 or " UNNEST(" not in sql or sql.count("(%s)::") != len(self.fields):
            raise ValueError(f"the insert of {self.model.__name__} is not one INSERT of arrays")
        if binds_arrays_in_binary(connections[alias]):
            sql = sql.replace("(%s)::", "(%b)::")
        return sql

    def insert(self, objects: Sequence[Model]) -> None:
        if not objects:
            return
        alias = router.db_for_write(self.model)
        connection = connections[alias]
        if connection.vendor != "postgresql":
            self.model._base_manager.using(alias).bulk_create(objects)
            return
        sql = self._compiled.get(alias)
        if sql is None:
            sql = self._compiled[alias] = self._compile(alias)
        for obj in objects:
            if not isinstance(obj, self.model) or obj.pk is not None or not obj._state.adding:
                raise ValueError(f"a compiled insert of {self.model.__name__} takes new rows without a key")
            # As bulk_create: a related object assigned before it was saved gives its key now.
            obj._prepare_related_fields_for_save(operation_name="bulk_create")  # type: ignore[attr-defined]
        columns = [
            [field.get_db_prep_save(field.pre_save(obj, True), connection) for obj in objects] for field in self.fields
        ]
        with transaction.mark_for_rollback_on_error(using=alias), connection.cursor() as cursor:
            cursor.execute(sql, columns)
            keys = cursor.fetchall()
        for obj, (key,) in zip(objects, keys, strict=True):
            obj.pk = key
            obj._state.adding = False
            obj._state.db = alias


class ValuesByPrimaryKey(Expression):
    """``CASE <pk> WHEN %s THEN %s ... END``: each row's own value of one column, for an UPDATE
    of several rows that sets a column to a different value on each.

    What ``Case(When(pk=..., then=Value(...)), ...)`` writes, without its cost: each ``When`` is a
    filter Django resolves against the model (about 0.1 ms of CPU a row), and the values here are
    only prepared, as ``Value`` prepares a value being saved. Rows of no branch get NULL, as with
    ``Case``: update only the rows named.
    """

    def __init__(self, field: Field, values: dict[Any, Any]) -> None:
        super().__init__(output_field=field)
        self.values = values
        self.key = F("pk")

    def get_source_expressions(self) -> list[Any]:
        return [self.key]

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        (self.key,) = exprs

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        field = self.output_field
        key_field = compiler.query.model._meta.pk
        key_sql, key_params = compiler.compile(self.key)
        # A field's own placeholder (get_placeholder, GIS fields) is not applied per branch: the
        # UPDATE compiler applies it around the whole CASE. No column written this way has one.
        branches = " ".join(["WHEN %s THEN %s"] * len(self.values))
        params: list[Any] = list(key_params)
        for key, value in self.values.items():
            params += [key_field.get_db_prep_value(key, connection), field.get_db_prep_save(value, connection)]
        return f"CASE {key_sql} {branches} END", params
