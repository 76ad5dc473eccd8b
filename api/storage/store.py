"""`Store`: every read and write of the service, as typed records in and out.

Each method runs in its own transaction, so a write is all or nothing: an upload that
fails half-way (bad row, lost connection, killed process) leaves no version and no rows.
Versions are `max + 1` inside the writing transaction, which holds a lock on what it
versions (`write_transaction`), so concurrent uploads of one thing queue instead of
colliding. Only two uploads with one Idempotency-Key for different things can still
collide (on the key's unique constraint); the loser retries and finds the winner's answer,
and after `_RETRIES` the caller gets `Conflict` (409, Retry-After) instead of an error.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from api.cache import LruCache
from api.errors import IdempotencyKeyReused, NotFound, UploadCollision
from api.storage import tables as t
from api.storage.db import write_transaction

__all__ = [
    "Catalogue",
    "Versioned",
    "ProfilePoint",
    "ProfileRow",
    "ProfileSetRecord",
    "LinkRow",
    "LinkSetRecord",
    "PlanRecord",
    "JobStatus",
    "JobKind",
    "JobRecord",
    "ClaimedJob",
    "LeaseState",
    "Store",
]

T = TypeVar("T")
R = TypeVar("R")
_RETRIES = 5


class Catalogue(StrEnum):
    """Named, versioned documents kept whole: GPU types, models, clusters."""

    GPU_TYPE = "gpu_type"
    MODEL = "model"
    CLUSTER = "cluster"


_CATALOGUE_TABLES = {
    Catalogue.GPU_TYPE: t.gpu_types,
    Catalogue.MODEL: t.models,
    Catalogue.CLUSTER: t.clusters,
}
_REGISTER_HINT = {
    Catalogue.GPU_TYPE: "POST /v1/gpu-types",
    Catalogue.MODEL: "POST /v1/models",
    Catalogue.CLUSTER: "POST /v1/clusters",
}


@dataclass(frozen=True, kw_only=True)
class Versioned:
    id: int
    name: str
    version: int
    document: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, kw_only=True)
class ProfilePoint:
    """One profile row of docs/formats.md (scenario), without the GPU type (its set has it)."""

    kind: str
    micro_batch: int
    tp: int
    forward_ms: float
    backward_ms: float
    activation_bytes: float
    uploaded: bool = True
    """False when shared unchanged with an earlier version (uploaded there)."""

    @property
    def point(self) -> tuple[str, int, int]:
        return (self.kind, self.micro_batch, self.tp)


@dataclass(frozen=True, kw_only=True)
class ProfileRow:
    """A point of the newest profiles of (model, GPU type), with the version it is in."""

    model: str
    gpu_type: str
    version: int
    point: ProfilePoint


@dataclass(frozen=True, kw_only=True)
class ProfileSetRecord:
    id: int
    model: str
    gpu_type: str
    version: int
    source: dict[str, Any] | None
    row_count: int
    uploaded_count: int
    replaced_count: int
    created_at: datetime
    rows: tuple[ProfilePoint, ...] = ()
    replayed: bool = False
    """True when this answers a repeated Idempotency-Key instead of a new upload."""


@dataclass(frozen=True, kw_only=True)
class LinkRow:
    scope: str
    bandwidth_gb_per_s: float
    latency_us: float
    gpu_type: str | None = None
    zones: tuple[str, str] | None = None
    uploaded: bool = True

    @property
    def key(self) -> tuple[str, str | None, tuple[str, ...] | None]:
        return (self.scope, self.gpu_type, tuple(sorted(self.zones)) if self.zones else None)


@dataclass(frozen=True, kw_only=True)
class LinkSetRecord:
    id: int
    version: int
    row_count: int
    uploaded_count: int
    replaced_count: int
    created_at: datetime
    links: tuple[LinkRow, ...] = ()
    replayed: bool = False


@dataclass(frozen=True, kw_only=True)
class PlanRecord:
    id: str
    created_at: datetime
    status: str
    wall_s: float
    document: dict[str, Any]
    evaluation: dict[str, Any]
    unused_gpus: dict[str, str]
    sources: dict[str, Any]
    options: dict[str, Any]
    scenario: dict[str, Any] = field(default_factory=dict)


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class JobKind(StrEnum):
    """What a job computes: one plan, a cost/throughput frontier, or what-if fleets."""

    PLAN = "plan"
    PARETO = "pareto"
    WHATIF = "whatif"


@dataclass(frozen=True, kw_only=True)
class JobRecord:
    id: str
    created_at: datetime
    updated_at: datetime
    status: JobStatus
    progress: float
    message: str
    plan_id: str | None
    error: dict[str, Any] | None
    cancel_requested: bool
    kind: JobKind = JobKind.PLAN
    result: dict[str, Any] | None = None
    owner: str | None = None
    lease_expires_at: datetime | None = None
    attempts: int = 0


@dataclass(frozen=True, kw_only=True)
class ClaimedJob:
    """A job a worker claimed, with the request it runs."""

    job: JobRecord
    request: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class LeaseState:
    """What a lease renewal found about one job the worker runs."""

    ours: bool
    """False when the job ended or another worker claimed it (our lease had lapsed)."""
    cancel_requested: bool


def _now() -> datetime:
    return datetime.now(UTC)


def _utc(value: datetime) -> datetime:
    """SQLite hands back naive datetimes; everything we store is UTC."""
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class Store:
    """Typed access to the database behind `engine` (SQLite or PostgreSQL)."""

    def __init__(self, engine: sa.Engine, *, cache_bytes: int = 16 * 2**20) -> None:
        """`cache_bytes`: memory for the points of profile versions and the links of link
        versions read here (see `_rows_of_set`)."""
        self.engine = engine
        self._rows_of_set: LruCache[tuple[Any, ...]] = LruCache(cache_bytes,
                                                                size_of=_estimated_bytes)
        """Points of a profile version and links of a link version, by the version's id:
        committed, they never change (a new upload is a new version with a new id, and
        nothing is deleted), so reads may keep them. The version rows themselves, and so
        which version is the newest, are read from the database every time."""

    def _cached_rows(self, key: tuple[str, Any], read: Callable[[], Iterable[R]]
                     ) -> tuple[R, ...]:
        """The rows of a stored version under `key`, from `_rows_of_set` or `read()`."""
        rows = self._rows_of_set.get(key)
        if rows is None:
            rows = tuple(read())
            self._rows_of_set.put(key, rows)
        return rows

    def ping(self) -> None:
        """Raise if the database cannot answer a trivial query."""
        with self.engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))

    def _write(self, lock_key: str, write: Callable[[sa.Connection], T]) -> T:
        """Run `write` in one transaction holding the lock on `lock_key`, retrying when a
        concurrent writer took the idempotency key it wanted."""
        for attempt in range(_RETRIES):
            try:
                with write_transaction(self.engine, lock_key) as connection:
                    return write(connection)
            except IntegrityError:
                time.sleep(random.uniform(0, 0.005 * (attempt + 1)))  # de-synchronise losers
        raise UploadCollision(f"{_RETRIES} attempts to store this upload collided with concurrent "
                       "uploads; retry it (with the same Idempotency-Key, if it had one)")

    # -- catalogue: GPU types, models, clusters ---------------------------------------

    def put_document(self, kind: Catalogue, name: str, document: dict[str, Any]) -> Versioned:
        """Store `document` as the next version of `name`."""
        table = _CATALOGUE_TABLES[kind]

        def write(connection: sa.Connection) -> Versioned:
            latest = connection.execute(
                sa.select(sa.func.max(table.c.version)).where(table.c.name == name)
            ).scalar_one()
            values: dict[str, Any] = {"name": name, "version": (latest or 0) + 1,
                                      "document": document,
                      "created_at": _now()}
            new_id = connection.execute(sa.insert(table).values(**values)).inserted_primary_key
            assert new_id is not None
            return Versioned(id=new_id[0], **values)

        return self._write(f"{kind.value}:{name}", write)

    def get_document(self, kind: Catalogue, name: str, version: int | None = None) -> Versioned:
        """`name` at `version` (default: the newest), or `NotFound` saying how to add it."""
        table = _CATALOGUE_TABLES[kind]
        query = sa.select(table).where(table.c.name == name)
        query = (query.where(table.c.version == version) if version is not None
                 else query.order_by(table.c.version.desc()).limit(1))
        with self.engine.connect() as connection:
            row = connection.execute(query).first()
        if row is None:
            at = "" if version is None else f" version {version}"
            raise NotFound(f"no {kind.value.replace('_', ' ')} {name!r}{at} is stored; "
                           f"register it with {_REGISTER_HINT[kind]}")
        return self._versioned(row)

    def list_documents(self, kind: Catalogue, *, limit: int, offset: int
                       ) -> tuple[list[Versioned], int]:
        """The newest version of each name, by name, and how many names there are."""
        table = _CATALOGUE_TABLES[kind]
        newest = (sa.select(table.c.name, sa.func.max(table.c.version).label("version"))
                  .group_by(table.c.name).subquery())
        query = (sa.select(table)
                 .join(newest, sa.and_(table.c.name == newest.c.name,
                                       table.c.version == newest.c.version))
                 .order_by(table.c.name).limit(limit).offset(offset))
        with self.engine.connect() as connection:
            rows = connection.execute(query).all()
            total = connection.execute(sa.select(sa.func.count()).select_from(newest)).scalar()
        return [self._versioned(row) for row in rows], int(total or 0)

    @staticmethod
    def _versioned(row: sa.Row[Any]) -> Versioned:
        return Versioned(id=row.id, name=row.name, version=row.version,
                         document=row.document, created_at=_utc(row.created_at))

    # -- profiles ------------------------------------------------------------------------

    def add_profile_set(
        self,
        *,
        model: str,
        gpu_type: str,
        rows: Sequence[ProfilePoint],
        source: dict[str, Any] | None,
        body_sha256: str,
        idempotency_key: str | None = None,
    ) -> ProfileSetRecord:
        """A new version of the (model, GPU type) profiles: the previous version's points
        with the uploaded ones replacing theirs. Only the uploaded rows are written (the
        others are shared with earlier versions), so the record has no `rows`. Same key
        and body as before: that answer."""

        def write(connection: sa.Connection) -> ProfileSetRecord:
            if idempotency_key is not None:
                earlier = connection.execute(sa.select(t.profile_sets).where(
                    t.profile_sets.c.idempotency_key == idempotency_key)).first()
                if earlier is not None:
                    _check_same_body(earlier.body_sha256, body_sha256, idempotency_key)
                    return self._profile_set(connection, earlier, replayed=True, with_rows=False)
            previous = connection.execute(
                sa.select(t.profile_sets)
                .where(t.profile_sets.c.model == model, t.profile_sets.c.gpu_type == gpu_type)
                .order_by(t.profile_sets.c.version.desc()).limit(1)
            ).first()
            uploaded = {row.point: row for row in rows}
            values: dict[str, Any] = {
                "model": model, "gpu_type": gpu_type,
                "version": 1 if previous is None else previous.version + 1,
                "source": source, "idempotency_key": idempotency_key,
                "body_sha256": body_sha256, "row_count": 0,
                "uploaded_count": len(uploaded), "replaced_count": 0, "created_at": _now(),
            }
            set_id = connection.execute(
                sa.insert(t.profile_sets).values(**values)).inserted_primary_key
            assert set_id is not None
            connection.execute(sa.insert(t.profile_rows), [
                {"set_id": set_id[0], "kind": r.kind, "micro_batch": r.micro_batch, "tp": r.tp,
                 "forward_ms": r.forward_ms, "backward_ms": r.backward_ms,
                 "activation_bytes": r.activation_bytes} for r in uploaded.values()])
            replaced = _count_replaced(connection, set_id[0], model, gpu_type)
            values["replaced_count"] = replaced
            values["row_count"] = (0 if previous is None else previous.row_count) + len(
                uploaded) - replaced
            connection.execute(sa.update(t.profile_sets).where(t.profile_sets.c.id == set_id[0])
                               .values(row_count=values["row_count"], replaced_count=replaced))
            del values["idempotency_key"], values["body_sha256"]
            return ProfileSetRecord(id=set_id[0], **values)

        return self._write(f"profiles:{model}\x00{gpu_type}", write)

    def get_profile_set(self, set_id: int, *, limit: int | None = None,
                        offset: int = 0) -> ProfileSetRecord:
        """One profile version, with its points from `offset` on (at most `limit`)."""
        with self.engine.connect() as connection:
            row = connection.execute(
                sa.select(t.profile_sets).where(t.profile_sets.c.id == set_id)).first()
            if row is None:
                raise NotFound(f"no profile set with id {set_id}; list them with "
                               "GET /v1/profiles/sets")
            return self._profile_set(connection, row, limit=limit, offset=offset)

    def find_profile_set(self, model: str, gpu_type: str, version: int | None = None
                         ) -> ProfileSetRecord | None:
        """The (model, GPU type) profiles at `version` (default: newest), with rows."""
        query = sa.select(t.profile_sets).where(
            t.profile_sets.c.model == model, t.profile_sets.c.gpu_type == gpu_type)
        query = (query.where(t.profile_sets.c.version == version) if version is not None
                 else query.order_by(t.profile_sets.c.version.desc()).limit(1))
        with self.engine.connect() as connection:
            row = connection.execute(query).first()
            if row is None:
                return None
            points = self._cached_rows(("profiles", row.id),
                                       lambda: self._profile_points(connection, row))
            return self._profile_set(connection, row, points=points)

    def list_profile_sets(self, *, model: str | None = None, gpu_type: str | None = None,
                          newest_only: bool = False, limit: int = 100, offset: int = 0
                          ) -> tuple[list[ProfileSetRecord], int]:
        """Profile sets (without rows), newest first, filtered by model and GPU type."""
        ps = t.profile_sets
        query = sa.select(ps)
        if model is not None:
            query = query.where(ps.c.model == model)
        if gpu_type is not None:
            query = query.where(ps.c.gpu_type == gpu_type)
        if newest_only:
            newest = (sa.select(ps.c.model, ps.c.gpu_type,
                                sa.func.max(ps.c.version).label("version"))
                      .group_by(ps.c.model, ps.c.gpu_type).subquery())
            query = query.join(newest, sa.and_(ps.c.model == newest.c.model,
                                               ps.c.gpu_type == newest.c.gpu_type,
                                               ps.c.version == newest.c.version))
        with self.engine.connect() as connection:
            total = connection.execute(
                sa.select(sa.func.count()).select_from(query.subquery())).scalar()
            rows = connection.execute(
                query.order_by(ps.c.model, ps.c.gpu_type, ps.c.version.desc())
                .limit(limit).offset(offset)).all()
            found = [self._profile_set(connection, row, with_rows=False) for row in rows]
        return found, int(total or 0)

    def _profile_set(self, connection: sa.Connection, row: sa.Row[Any], *,
                     replayed: bool = False, with_rows: bool = True, limit: int | None = None,
                     offset: int = 0, points: tuple[ProfilePoint, ...] | None = None
                     ) -> ProfileSetRecord:
        if points is None:
            points = (tuple(self._profile_points(connection, row, limit=limit, offset=offset))
                      if with_rows else ())
        return ProfileSetRecord(
            id=row.id, model=row.model, gpu_type=row.gpu_type, version=row.version,
            source=row.source, row_count=row.row_count, uploaded_count=row.uploaded_count,
            replaced_count=row.replaced_count, created_at=_utc(row.created_at), rows=points,
            replayed=replayed)

    @staticmethod
    def _profile_points(connection: sa.Connection, profile_set: Any, *,
                        limit: int | None = None, offset: int = 0) -> list[ProfilePoint]:
        """The points of `profile_set` (a profile_sets row) by (kind, micro_batch, tp):
        for each, the row of the newest version at or before it; paged in the database."""
        newest = _newest_rows(sa.and_(t.profile_sets.c.model == profile_set.model,
                                      t.profile_sets.c.gpu_type == profile_set.gpu_type,
                                      t.profile_sets.c.version <= profile_set.version),
                              partition=[])
        query = (sa.select(newest).where(newest.c.rank == 1)
                 .order_by(newest.c.kind, newest.c.micro_batch, newest.c.tp)
                 .limit(limit).offset(offset))
        return [ProfilePoint(kind=r.kind, micro_batch=r.micro_batch, tp=r.tp,
                             forward_ms=r.forward_ms, backward_ms=r.backward_ms,
                             activation_bytes=r.activation_bytes,
                             uploaded=r.version == profile_set.version)
                for r in connection.execute(query)]

    def newest_profile_rows(self, *, model: str | None, gpu_type: str | None,
                            kind: str | None, limit: int, offset: int
                            ) -> tuple[list[ProfileRow], int]:
        """Rows of the newest version of each (model, GPU type), filtered, by model, GPU
        type and point; paged in the database. The newest version holds every point ever
        uploaded for its pair, each as last uploaded."""
        ps = t.profile_sets
        conditions = [c for c in (None if model is None else ps.c.model == model,
                                  None if gpu_type is None else ps.c.gpu_type == gpu_type)
                      if c is not None]
        newest = _newest_rows(sa.and_(sa.true(), *conditions),
                              partition=[ps.c.model, ps.c.gpu_type])
        selected = sa.select(newest).where(newest.c.rank == 1)
        if kind is not None:
            selected = selected.where(newest.c.kind == kind)
        selected_rows = selected.subquery()
        versions = (sa.select(ps.c.model, ps.c.gpu_type, sa.func.max(ps.c.version).label("v"))
                    .group_by(ps.c.model, ps.c.gpu_type).subquery())
        query = (sa.select(selected_rows, versions.c.v)
                 .join(versions, sa.and_(versions.c.model == selected_rows.c.model,
                                         versions.c.gpu_type == selected_rows.c.gpu_type))
                 .order_by(selected_rows.c.model, selected_rows.c.gpu_type,
                           selected_rows.c.kind, selected_rows.c.micro_batch,
                           selected_rows.c.tp)
                 .limit(limit).offset(offset))
        with self.engine.connect() as connection:
            total = connection.execute(
                sa.select(sa.func.count()).select_from(selected_rows)).scalar()
            found = [ProfileRow(model=r.model, gpu_type=r.gpu_type, version=r.v,
                                point=ProfilePoint(
                                    kind=r.kind, micro_batch=r.micro_batch, tp=r.tp,
                                    forward_ms=r.forward_ms, backward_ms=r.backward_ms,
                                    activation_bytes=r.activation_bytes,
                                    uploaded=r.version == r.v))
                     for r in connection.execute(query)]
        return found, int(total or 0)

    # -- links ---------------------------------------------------------------------------

    def add_link_set(self, *, links: Sequence[LinkRow], body_sha256: str,
                     idempotency_key: str | None = None) -> LinkSetRecord:
        """A new version of the link catalogue: the previous links with the uploaded ones
        replacing those of the same scope, GPU type and zone pair."""

        def write(connection: sa.Connection) -> LinkSetRecord:
            if idempotency_key is not None:
                earlier = connection.execute(sa.select(t.link_sets).where(
                    t.link_sets.c.idempotency_key == idempotency_key)).first()
                if earlier is not None:
                    _check_same_body(earlier.body_sha256, body_sha256, idempotency_key)
                    return self._link_set(connection, earlier, replayed=True)
            previous = connection.execute(
                sa.select(t.link_sets).order_by(t.link_sets.c.version.desc()).limit(1)).first()
            uploaded = {link.key: link for link in links}
            carried: list[LinkRow] = []
            replaced = 0
            if previous is not None:
                for old in self._link_rows(connection, previous.id):
                    if old.key in uploaded:
                        replaced += 1
                    else:
                        carried.append(LinkRow(scope=old.scope, gpu_type=old.gpu_type,
                                               zones=old.zones, uploaded=False,
                                               bandwidth_gb_per_s=old.bandwidth_gb_per_s,
                                               latency_us=old.latency_us))
            values: dict[str, Any] = {
                "version": 1 if previous is None else previous.version + 1,
                "idempotency_key": idempotency_key, "body_sha256": body_sha256,
                "row_count": len(uploaded) + len(carried), "uploaded_count": len(uploaded),
                "replaced_count": replaced, "created_at": _now(),
            }
            set_id = connection.execute(
                sa.insert(t.link_sets).values(**values)).inserted_primary_key
            assert set_id is not None
            all_links = [*uploaded.values(), *carried]
            connection.execute(sa.insert(t.link_rows), [
                {"set_id": set_id[0], "scope": link.scope, "gpu_type": link.gpu_type,
                 "zone_a": link.zones[0] if link.zones else None,
                 "zone_b": link.zones[1] if link.zones else None,
                 "bandwidth_gb_per_s": link.bandwidth_gb_per_s, "latency_us": link.latency_us,
                 "uploaded": link.uploaded}
                for link in all_links
            ])
            del values["idempotency_key"], values["body_sha256"]
            return LinkSetRecord(id=set_id[0], links=tuple(all_links), **values)

        return self._write("links", write)

    def get_link_set(self, version: int | None = None) -> LinkSetRecord | None:
        """The link catalogue at `version` (default: newest); None when nothing is stored."""
        query = sa.select(t.link_sets)
        query = (query.where(t.link_sets.c.version == version) if version is not None
                 else query.order_by(t.link_sets.c.version.desc()).limit(1))
        with self.engine.connect() as connection:
            row = connection.execute(query).first()
            if row is None:
                return None
            links = self._cached_rows(("links", row.id),
                                      lambda: self._link_rows(connection, row.id))
            return self._link_set(connection, row, links=links)

    def _link_set(self, connection: sa.Connection, row: sa.Row[Any], *,
                  replayed: bool = False, links: tuple[LinkRow, ...] | None = None
                  ) -> LinkSetRecord:
        return LinkSetRecord(
            id=row.id, version=row.version, row_count=row.row_count,
            uploaded_count=row.uploaded_count, replaced_count=row.replaced_count,
            created_at=_utc(row.created_at),
            links=tuple(self._link_rows(connection, row.id)) if links is None else links,
            replayed=replayed)

    @staticmethod
    def _link_rows(connection: sa.Connection, set_id: int) -> list[LinkRow]:
        lr = t.link_rows
        rows = connection.execute(
            sa.select(lr).where(lr.c.set_id == set_id).order_by(lr.c.id)).all()
        return [LinkRow(scope=r.scope, gpu_type=r.gpu_type,
                        zones=(r.zone_a, r.zone_b) if r.zone_a is not None else None,
                        bandwidth_gb_per_s=r.bandwidth_gb_per_s, latency_us=r.latency_us,
                        uploaded=r.uploaded) for r in rows]

    # -- plans ---------------------------------------------------------------------------

    def add_plan(self, plan: PlanRecord) -> None:
        values = {f: getattr(plan, f) for f in PlanRecord.__dataclass_fields__}
        with write_transaction(self.engine) as connection:
            connection.execute(sa.insert(t.plans).values(**values))

    def get_plan(self, plan_id: str, *, with_scenario: bool = False) -> PlanRecord:
        columns = [c for c in t.plans.c if with_scenario or c.name != "scenario"]
        with self.engine.connect() as connection:
            row = connection.execute(
                sa.select(*columns).where(t.plans.c.id == plan_id)).first()
        if row is None:
            raise NotFound(f"no plan with id {plan_id!r}; list stored plans with GET /v1/plans")
        values = row._asdict()
        values["created_at"] = _utc(values["created_at"])
        return PlanRecord(**values)

    def list_plans(self, *, limit: int, offset: int) -> tuple[list[PlanRecord], int]:
        """Plans newest first, without their documents' scenario copies."""
        columns = [c for c in t.plans.c if c.name != "scenario"]
        with self.engine.connect() as connection:
            rows = connection.execute(
                sa.select(*columns).order_by(t.plans.c.created_at.desc(), t.plans.c.id)
                .limit(limit).offset(offset)).all()
            total = connection.execute(sa.select(sa.func.count()).select_from(t.plans)).scalar()
        plans = []
        for row in rows:
            values = row._asdict()
            values["created_at"] = _utc(values["created_at"])
            plans.append(PlanRecord(**values))
        return plans, int(total or 0)

    # -- jobs ----------------------------------------------------------------------------

    def add_job(self, job_id: str, *, kind: JobKind = JobKind.PLAN,
                request: dict[str, Any] | None = None) -> JobRecord:
        """A queued job; `request` is what a worker needs to run it."""
        now = _now()
        values = {"id": job_id, "created_at": now, "updated_at": now,
                  "status": JobStatus.QUEUED.value, "progress": 0.0, "message": "queued",
                  "plan_id": None, "error": None, "cancel_requested": False,
                  "kind": kind.value, "request": request, "attempts": 0}
        with write_transaction(self.engine) as connection:
            connection.execute(sa.insert(t.jobs).values(**values))
        del values["request"]
        return self._job(values)

    def count_unfinished_jobs(self) -> int:
        """Queued plus running jobs, of every process."""
        final = [s.value for s in JobStatus if s.final]
        with self.engine.connect() as connection:
            return int(connection.execute(sa.select(sa.func.count()).select_from(t.jobs).where(
                t.jobs.c.status.not_in(final))).scalar() or 0)

    def update_job(self, job_id: str, *, expect: JobStatus | None = None,
                   owner: str | None = None, **changes: Any) -> JobRecord:
        """Change a job's fields; a job that reached a final status is never changed, nor
        one whose status is not `expect` (when given), nor one another worker than `owner`
        (when given) has claimed since."""
        changes["updated_at"] = _now()
        if "status" in changes:
            changes["status"] = JobStatus(changes["status"]).value
        final = [s.value for s in JobStatus if s.final]
        query = sa.update(t.jobs).where(t.jobs.c.id == job_id, t.jobs.c.status.not_in(final))
        if expect is not None:
            query = query.where(t.jobs.c.status == expect.value)
        if owner is not None:
            query = query.where(t.jobs.c.owner == owner)
        with write_transaction(self.engine) as connection:
            connection.execute(query.values(**changes))
        return self.get_job(job_id)

    def claim_job(self, *, owner: str, lease_s: float, max_attempts: int,
                  exhausted_error: Callable[[int], dict[str, Any]]) -> ClaimedJob | None:
        """Take the oldest job that is queued or whose lease lapsed, for `owner`, until
        `lease_s` from now; None when there is none. Rows other workers are claiming are
        skipped (PostgreSQL: `FOR UPDATE SKIP LOCKED`; SQLite: the transaction holds the
        database's write lock from BEGIN). Lapsed jobs met on the way end here: cancelled
        when a cancel was asked, failed with `exhausted_error(attempts)` once
        `max_attempts` attempts were started."""
        jobs, final = t.jobs, [s.value for s in JobStatus if s.final]
        with write_transaction(self.engine) as connection:
            now = _now()
            lapsed = sa.and_(jobs.c.status == JobStatus.RUNNING.value,
                             jobs.c.lease_expires_at < now)
            oldest = (sa.select(jobs.c.id, jobs.c.status, jobs.c.attempts,
                                jobs.c.cancel_requested)
                      .where(sa.or_(jobs.c.status == JobStatus.QUEUED.value, lapsed))
                      .order_by(jobs.c.created_at, jobs.c.id).limit(1)
                      .with_for_update(skip_locked=True))
            # one row locked at a time, so that concurrent claimers skip only that one
            while (row := connection.execute(oldest).first()) is not None:
                ending = self._end_of_lapsed(row, max_attempts, exhausted_error)
                update = sa.update(jobs).where(jobs.c.id == row.id,
                                               jobs.c.status.not_in(final))
                if ending is not None:
                    connection.execute(update.values(updated_at=now, owner=None, **ending))
                    continue
                connection.execute(update.values(
                    status=JobStatus.RUNNING.value, owner=owner, updated_at=now,
                    lease_expires_at=now + timedelta(seconds=lease_s),
                    attempts=row.attempts + 1,
                    message="solving" if row.attempts == 0 else
                    f"solving (attempt {row.attempts + 1} of {max_attempts})"))
                claimed = connection.execute(
                    sa.select(jobs).where(jobs.c.id == row.id)).one()._asdict()
                request = claimed.pop("request") or {}
                return ClaimedJob(job=self._job(claimed), request=request)
        return None

    @staticmethod
    def _end_of_lapsed(row: Any, max_attempts: int,
                       exhausted_error: Callable[[int], dict[str, Any]]
                       ) -> dict[str, Any] | None:
        """The final fields of a lapsed job that must not run again; None to run it."""
        if row.status != JobStatus.RUNNING.value:
            return None
        if row.cancel_requested:
            return {"status": JobStatus.CANCELLED.value, "message": "cancelled"}
        if row.attempts >= max_attempts:
            error = exhausted_error(row.attempts)
            return {"status": JobStatus.FAILED.value, "error": error,
                    "message": str(error.get("message", ""))[:500]}
        return None

    def renew_leases(self, owner: str, job_ids: Iterable[str],
                     lease_s: float) -> dict[str, LeaseState]:
        """Move the leases of `owner`'s running jobs `lease_s` past now; for each job, whether
        it is still ours and whether a cancel was asked."""
        ids = list(job_ids)
        if not ids:
            return {}
        jobs = t.jobs
        with write_transaction(self.engine) as connection:
            now = _now()
            connection.execute(sa.update(jobs).where(
                jobs.c.id.in_(ids), jobs.c.owner == owner,
                jobs.c.status == JobStatus.RUNNING.value).values(
                    lease_expires_at=now + timedelta(seconds=lease_s), updated_at=now))
            rows = connection.execute(sa.select(
                jobs.c.id, jobs.c.owner, jobs.c.status, jobs.c.cancel_requested).where(
                    jobs.c.id.in_(ids))).all()
        found = {r.id: LeaseState(ours=r.owner == owner and r.status == JobStatus.RUNNING.value,
                                  cancel_requested=bool(r.cancel_requested)) for r in rows}
        return {i: found.get(i, LeaseState(ours=False, cancel_requested=False)) for i in ids}

    def release_jobs(self, owner: str, job_ids: Iterable[str]) -> int:
        """Queue `owner`'s running jobs again, their attempt not counted (a worker that
        shuts down cleanly did not fail them); how many were released."""
        ids = list(job_ids)
        if not ids:
            return 0
        jobs = t.jobs
        with write_transaction(self.engine) as connection:
            result = connection.execute(sa.update(jobs).where(
                jobs.c.id.in_(ids), jobs.c.owner == owner,
                jobs.c.status == JobStatus.RUNNING.value).values(
                    status=JobStatus.QUEUED.value, owner=None, lease_expires_at=None,
                    attempts=sa.case((jobs.c.attempts > 0, jobs.c.attempts - 1), else_=0),
                    progress=0.0, message="queued again: its worker shut down",
                    updated_at=_now()))
        return int(result.rowcount or 0)

    def get_job(self, job_id: str) -> JobRecord:
        columns = [c for c in t.jobs.c if c.name != "request"]
        with self.engine.connect() as connection:
            row = connection.execute(sa.select(*columns).where(t.jobs.c.id == job_id)).first()
        if row is None:
            raise NotFound(f"no job with id {job_id!r}; jobs are created by POST /v1/plans "
                           "(and, when long, POST /v1/plans/pareto and POST /v1/whatif)")
        return self._job(row._asdict())

    @staticmethod
    def _job(values: dict[str, Any]) -> JobRecord:
        values = dict(values)
        values["status"] = JobStatus(values["status"])
        values["kind"] = JobKind(values.get("kind") or JobKind.PLAN.value)
        values["created_at"] = _utc(values["created_at"])
        values["updated_at"] = _utc(values["updated_at"])
        if values.get("lease_expires_at") is not None:
            values["lease_expires_at"] = _utc(values["lease_expires_at"])
        return JobRecord(**values)

    # -- table counts, for tests and readiness --------------------------------------------

    def count_rows(self, tables: Iterable[str]) -> dict[str, int]:
        with self.engine.connect() as connection:
            return {name: int(connection.execute(
                sa.select(sa.func.count()).select_from(t.metadata.tables[name])).scalar() or 0)
                for name in tables}


_ROW_BYTES = 512
"""Memory of one cached profile point or link, rounded up (tracemalloc: about 330 and 400
bytes)."""


def _estimated_bytes(rows: tuple[Any, ...]) -> int:
    return _ROW_BYTES * max(1, len(rows))


def _newest_rows(sets: sa.ColumnElement[bool], partition: list[Any]) -> sa.Subquery:
    """Profile rows of the sets matching `sets`, each with the version of its set and its
    `rank` among rows of the same point (and `partition` columns), newest version first:
    rank 1 is the point's row in the newest of those versions."""
    ps, pr = t.profile_sets, t.profile_rows
    rank = sa.func.row_number().over(
        partition_by=[*partition, pr.c.kind, pr.c.micro_batch, pr.c.tp],
        order_by=ps.c.version.desc())
    return (sa.select(ps.c.model, ps.c.gpu_type, ps.c.version, pr.c.kind, pr.c.micro_batch,
                      pr.c.tp, pr.c.forward_ms, pr.c.backward_ms, pr.c.activation_bytes,
                      rank.label("rank"))
            .join(ps, ps.c.id == pr.c.set_id).where(sets).subquery())


def _count_replaced(connection: sa.Connection, set_id: int, model: str, gpu_type: str) -> int:
    """How many rows of set `set_id` repeat a point some other version of (model,
    GPU type) uploaded: the points this version replaces."""
    new, old, ps = t.profile_rows.alias("new"), t.profile_rows.alias("old"), t.profile_sets
    earlier = (sa.select(old.c.id).join(ps, ps.c.id == old.c.set_id)
               .where(ps.c.model == model, ps.c.gpu_type == gpu_type, ps.c.id != set_id,
                      old.c.kind == new.c.kind, old.c.micro_batch == new.c.micro_batch,
                      old.c.tp == new.c.tp))
    return int(connection.execute(sa.select(sa.func.count()).select_from(new).where(
        new.c.set_id == set_id, earlier.exists())).scalar() or 0)


def _check_same_body(stored_sha256: str, sha256: str, key: str) -> None:
    if stored_sha256 != sha256:
        raise IdempotencyKeyReused(
            f"Idempotency-Key {key!r} was already used with a different body; send a new key "
            "for a new upload, or resend exactly the same body to get the earlier answer")
