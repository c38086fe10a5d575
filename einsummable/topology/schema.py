"""The topology YAML document as pydantic models: its keys, types, units and exactly-one-of
rules. `parse_document` validates a parsed document and turns the first problem into a
TopologyError that names the file, the field path (`links[2].bw`) and a fix.

The schema itself is described for users at the top of `reader.py`. What depends on more
than one field's value (device type references, device ids against the device count, one
link per pair) is checked where the rules are expanded (`expand.py`), and what a topology
made in code must satisfy too (levels partition the devices, the links connect them) in
`checks.py`.
"""
from __future__ import annotations

import math
import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import (BaseModel, ConfigDict, Field, PlainValidator, ValidationError,
                      model_validator)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from ..errors import TopologyError
from .achieved import DATASHEET, Achieved, Curve
from .units import DTYPES, LINK_KINDS, QUANTITY_KINDS, parse_quantity

PAIR_SELECTORS: tuple[str, ...] = ("all", "within_node", "across_nodes", "rails", "unlinked")


GROUP_SELECTORS: tuple[str, ...] = ("per_node", "per_device")


# The pydantic error type of our own validators' errors; their context carries the message,
# the fix and the path below the failing field ("at").
_OWN_ERROR: str = "topology"


def _problem(message: str, fix: str, *at: str | int) -> PydanticCustomError:
    """An error for pydantic to report at the field being validated (plus ``at`` below it).
    The message travels in the context, not the template, so braces in it stay as written."""
    return PydanticCustomError(_OWN_ERROR, "{message}", {"message": message, "fix": fix,
                                                         "at": at})


# ---- value types ----

def _quantity(kind: str, *, positive: bool) -> PlainValidator:
    """A number in base units or a string with a unit of ``kind``, parsed to float."""
    word, example, base = QUANTITY_KINDS[kind]
    what = "positive" if positive else "non-negative"

    def parse(value: Any) -> float:
        try:
            x = parse_quantity(value, kind)
        except ValueError as e:
            raise _problem(str(e), f"write e.g. {example}") from None
        if not math.isfinite(x) or not (x > 0 if positive else x >= 0):
            raise _problem(f"expected a {what} {word} ({base}), got {value!r}",
                           f"write a {what} value, e.g. {example}")
        return x
    return PlainValidator(parse)


Bandwidth = Annotated[float, _quantity("bandwidth", positive=True)]


FlopRate = Annotated[float, _quantity("flops", positive=True)]


Size = Annotated[float, _quantity("bytes", positive=True)]


Duration = Annotated[float, _quantity("time", positive=False)]


Count = Annotated[int, Field(ge=1)]


DeviceId = Annotated[int, Field(ge=0)]


Text = Annotated[str, Field(min_length=1)]


def _is_id(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _link_kind(value: Any) -> str:
    if not isinstance(value, str) or value not in LINK_KINDS:
        raise _problem(f"unknown link kind {value!r}", f"use one of {', '.join(LINK_KINDS)}")
    return value


def _pair(p: Any, i: int) -> tuple[int, int, int | None]:
    """[a, b] or [a, b, lanes] -> (a, b, lanes or None)."""
    if not isinstance(p, list) or len(p) not in (2, 3):
        raise _problem(f"expected [a, b] or [a, b, lanes], got {p!r}",
                       "write a pair of device ids, optionally with a lane count", i)
    for d in p[:2]:
        if not _is_id(d):
            raise _problem(f"device {d!r} does not exist", "link only declared devices", i)
    if p[0] == p[1]:
        raise _problem(f"links device {p[0]} to itself",
                       "drop it: a device needs no link to itself", i)
    if len(p) == 3 and not (_is_id(p[2]) and p[2] >= 1):
        raise _problem(f"expected an integer >= 1, got {p[2]!r}", "write a whole number >= 1",
                       i, 2)
    return (p[0], p[1], p[2] if len(p) == 3 else None)


def _pairs(value: Any) -> str | tuple[tuple[int, int, int | None], ...]:
    """A selector name, or explicit pairs (a YAML list of two or three numbers is not a
    pydantic tuple type without a union, whose errors would name its arms)."""
    if isinstance(value, str):
        if value not in PAIR_SELECTORS:
            raise _problem(f"unknown pair selector {value!r}", "use a list of [a, b] pairs or "
                           f"one of {', '.join(PAIR_SELECTORS)}")
        return value
    if not isinstance(value, list) or not value:
        raise _problem(f"expected a non-empty list of [a, b] or [a, b, lanes], got {value!r}",
                       f"or use one of {', '.join(PAIR_SELECTORS)}")
    return tuple(_pair(p, i) for i, p in enumerate(value))


def _groups(value: Any) -> str | tuple[tuple[int, ...], ...]:
    """per_node, per_device, or explicit groups of device ids (checked against the devices
    later: groups must partition them, `checks.py`)."""
    if isinstance(value, str) and value in GROUP_SELECTORS:
        return value
    if isinstance(value, list) and all(isinstance(g, list) and all(_is_id(d) for d in g)
                                       for g in value):
        return tuple(tuple(g) for g in value)
    raise _problem(f"expected {' or '.join(GROUP_SELECTORS)} or a list of device-id lists, "
                   f"got {value!r}", "write groups: [[0, 1], [2, 3]]")


def _fraction(value: Any, *, low_open: bool = True) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
        0 < value <= 1 if low_open else 0 <= value < 1)
    if not ok:
        span = "(0, 1]" if low_open else "[0, 1)"
        raise _problem(f"expected a fraction in {span}, got {value!r}",
                       "write e.g. 0.8 (of the datasheet figure)")
    return float(value)


def _curve(value: Any) -> Curve:
    """A fraction of peak, or [[FLOPs per call, fraction], ...] with FLOPs increasing."""
    if not isinstance(value, list):
        return Curve.constant(_fraction(value))
    points = []
    for i, p in enumerate(value):
        if not (isinstance(p, list) and len(p) == 2 and isinstance(p[0], (int, float))
                and not isinstance(p[0], bool) and p[0] > 0):
            raise _problem(f"expected [FLOPs per call, fraction], got {p!r}",
                           "write e.g. [1.0e9, 0.5] (a 1 GFLOP call reaches half of peak)", i)
        points.append((float(p[0]), _fraction(p[1])))
    if not points or any(b[0] <= a[0] for a, b in zip(points, points[1:])):
        raise _problem("expected points with increasing FLOP counts, at least one",
                       "list the points from the smallest call to the largest")
    return Curve(tuple(points))


LinkKind = Annotated[str, PlainValidator(_link_kind)]


CurveSpec = Annotated[Any, PlainValidator(_curve)]


Fraction = Annotated[float, PlainValidator(_fraction)]


Slowdown = Annotated[float, PlainValidator(lambda v: _fraction(v, low_open=False))]


def _share(value: Any) -> float:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1):
        raise _problem(f"expected a share in [0, 1], got {value!r}",
                       "write 1 (every byte read and written at the ends) or 0 (none)")
    return float(value)


Share = Annotated[float, PlainValidator(_share)]


Pairs = Annotated[Any, PlainValidator(_pairs)]


Groups = Annotated[Any, PlainValidator(_groups)]


# ---- the document ----

class _Part(BaseModel):
    """A part of the document: YAML's own types only (no "5" for 5), no unknown keys."""
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class PeakFlops(_Part):
    float16: FlopRate = Field(description="peak float16 rate, e.g. 312 TFLOP/s")
    bfloat16: FlopRate = Field(description="peak bfloat16 rate, e.g. 312 TFLOP/s")
    float32: FlopRate = Field(description="peak float32 rate, e.g. 19.5 TFLOP/s")


assert tuple(PeakFlops.model_fields) == DTYPES  # one rate per dtype the planner knows


class AchievedSpec(_Part):
    """What a device achieves of its datasheet figures (`achieved.py`)."""
    matmul: CurveSpec = Field(DATASHEET, description="fraction of peak, or [[FLOPs, fraction]]")
    attention: CurveSpec = Field(DATASHEET, description="fraction of peak, or [[FLOPs, "
                                 "fraction]]")
    memory: Fraction = Field(1.0, description="fraction of mem_bw, e.g. 0.85")
    transfer_slowdown: Slowdown = Field(0.0, description="compute lost while a transfer runs, "
                                        "e.g. 0.1")
    transfer_memory: Share = Field(0.0, description="share of a transfer's bytes its ends' "
                                      "memory carries beside kernels, e.g. 1")

    def to_achieved(self) -> Achieved:
        return Achieved(self.matmul, self.attention, self.memory, self.transfer_slowdown,
                        self.transfer_memory)


class DeviceSpec(_Part):
    peak_flops: PeakFlops = Field(description="a rate per dtype, e.g. {float16: 312 TFLOP/s, "
                                  "bfloat16: 312 TFLOP/s, float32: 19.5 TFLOP/s}")
    mem_bw: Bandwidth = Field(description="memory bandwidth, e.g. 1555 GB/s")
    mem_bytes: Size = Field(description="memory size, e.g. 40 GB")
    launch: Duration = Field(description="kernel launch overhead, e.g. 5 us")
    message: Duration = Field(0.0, description="host time per point-to-point message")
    exchange_wait: Duration = Field(0.0, description="host time a rank loses waiting in a "
                                    "two-way exchange, e.g. 500 us for gloo ranks (0: none)")
    prefetch_stream: bool = Field(False, description="whether the device runs a weight's "
                                  "prefetch (its transfers' launches, its stitching copies) on "
                                  "streams beside its kernels (GPUs: true; gloo ranks: false)")
    achieved: AchievedSpec | None = Field(None, description="achieved fractions of the "
                                          "datasheet figures")

    def device_args(self) -> dict[str, Any]:
        """The `model.Device` fields this spec gives."""
        return {"peak_flops": self.peak_flops.model_dump(), "mem_bw": self.mem_bw,
                "mem_bytes": self.mem_bytes, "launch_s": self.launch,
                "message_s": self.message, "exchange_wait_s": self.exchange_wait,
                "prefetch_stream": self.prefetch_stream,
                "achieved": Achieved() if self.achieved is None
                else self.achieved.to_achieved()}


_SPEC_KEYS: tuple[str, ...] = tuple(DeviceSpec.model_fields)


class Nodes(_Part):
    count: Count = 1
    devices_per_node: Count = Field(description="devices in each node, e.g. 8")
    device_type: str = Field(description="a name declared under device_types")
    name: str | None = Field(None, description="device name template")


class ExplicitDevice(_Part):
    """One device of an explicit list: a device type, or the spec's keys inline."""
    id: DeviceId = Field(description="its rank, 0..n-1")
    node: DeviceId = 0
    name: Text | None = None
    type: str | None = None
    peak_flops: PeakFlops | None = None
    mem_bw: Bandwidth | None = None
    mem_bytes: Size | None = None
    launch: Duration | None = None
    message: Duration | None = None
    exchange_wait: Duration | None = None
    prefetch_stream: bool | None = None
    achieved: AchievedSpec | None = None

    @model_validator(mode="after")
    def _type_or_inline_spec(self) -> ExplicitDevice:
        given = [k for k in _SPEC_KEYS if getattr(self, k) is not None]
        if self.type is not None and given:
            raise _problem("given together with 'type'",
                           "either reference a device type or spell the spec inline", given[0])
        if self.type is None:
            for k, f in DeviceSpec.model_fields.items():
                if f.is_required() and k not in given:
                    raise _problem("missing", f"add '{k}:' ({f.description}), or 'type:'", k)
        return self

    def spec(self) -> DeviceSpec:
        """The inline spec (when there is no type)."""
        return DeviceSpec.model_validate(
            {k: getattr(self, k) for k in _SPEC_KEYS if getattr(self, k) is not None})


class LinkRule(_Part):
    """Links of one kind between selected pairs, both directions unless oneway."""
    kind: LinkKind = Field(description=f"one of {', '.join(LINK_KINDS)}")
    pairs: Pairs | None = None
    src: DeviceId | None = None
    dst: DeviceId | None = None
    bw: Bandwidth | None = None
    total_bw: Bandwidth | None = None
    latency: Duration = Field(description="per message, e.g. 3 us")
    lanes: Count = 1
    shared: str | None = None
    port: Text | None = None
    port_bw: Bandwidth | None = None
    oneway: bool = False
    replace: bool = False

    @model_validator(mode="after")
    def _exactly_one_of(self) -> LinkRule:
        if (self.bw is None) == (self.total_bw is None):
            raise _problem("give exactly one of bw (per lane) or total_bw",
                           "write bw: 25 GB/s (per direction, per lane)", "bw")
        if (self.pairs is None) == (self.src is None and self.dst is None):
            raise _problem("give exactly one of 'pairs' or 'src'/'dst'", "write pairs: [[0, 1], "
                           f"...] or one of {', '.join(PAIR_SELECTORS)}", "pairs")
        for end in ("src", "dst"):
            if self.pairs is None and getattr(self, end) is None:
                raise _problem("missing", f"add '{end}:' (a device id)", end)
        if self.pairs is None and self.src == self.dst:
            raise _problem(f"links device {self.src} to itself",
                           "drop it: a device needs no link to itself", "dst")
        if (self.port is None) != (self.port_bw is None):
            raise _problem("give port and port_bw together", "write port: nvlink, port_bw: "
                           "300 GB/s (per device, per direction)",
                           "port_bw" if self.port is not None else "port")
        return self


class LevelSpec(_Part):
    name: Text = Field(description="e.g. node or gpu")
    groups: Groups = Field(description=f"{' or '.join(GROUP_SELECTORS)} or [[0, 1], ...]")


class Document(_Part):
    """A whole topology file."""
    name: Text = Field(description="the topology's name")
    source_notes: str = ""
    device_types: dict[str, DeviceSpec] = Field(default_factory=dict)
    nodes: Nodes | None = None
    devices: Annotated[list[ExplicitDevice], Field(min_length=1)] | None = None
    links: list[LinkRule] = Field(description="link rules: [{kind, pairs, bw, latency}, ...]")
    levels: Annotated[list[LevelSpec], Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _one_device_form(self) -> Document:
        if (self.nodes is None) == (self.devices is None):
            raise _problem("give exactly one of 'nodes' (compact) or 'devices' (explicit)",
                           "use nodes: {count, devices_per_node, device_type} for uniform "
                           "machines", "nodes")
        return self


# ---- errors in our words ----

# Pydantic's error types -> (message, fix); formatted with the error's context, its input and
# `key` (the last name of the path) and `allowed` (the keys the enclosing mapping allows).
_STANDARD_ERRORS: dict[str, tuple[str, str]] = {
    "missing": ("missing", "add '{key}:'{described}"),
    "extra_forbidden": ("unknown key", "allowed keys here: {allowed}"),
    "model_type": ("expected a mapping, got {input_type} {input!r}",
                   "write a mapping with keys {allowed}"),
    "dict_type": ("expected a mapping, got {input_type} {input!r}", "write a mapping"),
    "list_type": ("expected a list, got {input_type} {input!r}", "write a list: [...]"),
    "too_short": ("expected a non-empty list", "give at least one entry"),
    "string_type": ("expected a string, got {input!r}", "write text"),
    "string_too_short": ("expected a non-empty string, got {input!r}", "write some text"),
    "int_type": ("expected an integer, got {input!r}", "write a whole number"),
    "greater_than_equal": ("expected an integer >= {ge}, got {input!r}",
                           "write a whole number >= {ge}"),
    "bool_type": ("expected true or false, got {input!r}", "write true or false"),
}


_SCHEMA_HINT: str = "see the schema at the top of einsummable/topology/reader.py"


def parse_document(data: Any, origin: str) -> Document:
    """The validated document; TopologyError naming ``origin`` and the field path if not."""
    try:
        return Document.model_validate(data)
    except ValidationError as e:
        errors = e.errors(include_url=False)
    path, message, fix = _explain(errors[0])
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    raise TopologyError(f"{origin}: {path}: {message}", fix=fix)


def _explain(error: dict) -> tuple[str, str, str]:
    ctx = error.get("ctx") or {}
    loc = tuple(error["loc"]) + tuple(ctx.get("at", ()))
    path = field_path(loc)
    if error["type"] == _OWN_ERROR:
        return path, ctx["message"], ctx["fix"]
    if error["type"] not in _STANDARD_ERRORS:
        return path, error["msg"], _SCHEMA_HINT
    model = _model_at(loc) or _model_at(loc[:-1])
    info = _field_at(loc)
    values = {**ctx, "input": error.get("input"), "key": loc[-1] if loc else "",
              "input_type": type(error.get("input")).__name__,
              "allowed": ", ".join(model.model_fields) if model else _SCHEMA_HINT,
              "described": f" ({info.description})" if info and info.description else ""}
    message, fix = _STANDARD_ERRORS[error["type"]]
    return path, message.format(**values), fix.format(**values)


def field_path(loc: tuple) -> str:
    """('links', 2, 'bw') -> 'links[2].bw'; the empty path is the whole document."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


def _step(annotation: Any, part: str | int) -> Any:
    """The annotation one path step below ``annotation`` (None where there is none)."""
    for arm in _arms(annotation):
        if _is_model(arm):
            if part in arm.model_fields:
                return arm.model_fields[part].annotation
        elif get_origin(arm) is list and isinstance(part, int):
            return get_args(arm)[0]
        elif get_origin(arm) is dict:
            return get_args(arm)[1]
    return None


def _arms(annotation: Any) -> tuple:
    """The types an annotation may hold: its Optional/Union arms, Annotated unwrapped."""
    if get_origin(annotation) is Annotated:
        return _arms(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(a for arm in get_args(annotation) for a in _arms(arm))
    return (annotation,)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model class the document holds at ``loc``, if it holds one there."""
    annotation: Any = Document
    for part in loc:
        annotation = _step(annotation, part)
    return next((a for a in _arms(annotation) if _is_model(a)), None)


def _field_at(loc: tuple) -> FieldInfo | None:
    """The model field that ``loc`` ends at, if it ends at one."""
    model = _model_at(loc[:-1]) if loc else None
    return model.model_fields.get(loc[-1]) if model is not None else None  # type: ignore
