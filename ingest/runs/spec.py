"""Run specs: what to run, where, at which commit, with which patches. Specs are data (a dict
read from TOML or JSON, stored as JSON in the job queue) and are checked here, field by field,
before anything runs. A config file names hosts, repositories, patch sets and the directories
the import engine may read.

Code runs only from a repository the config names ([repos]) or, for the reference engine, this
checkout (OWN_CHECKOUT): a spec naming another repository, or a `repo_path` that is not the
config's checkout of its repo, is refused here, whoever wrote it (the form, `ingest run`, a job
row of an older stepwatch), and again by the worker before it runs git (repos.check_code_source).
The import engine reads only paths under the config's `[imports] roots` (none by default).

Checks refuse what could be mistaken for an option or carry shell syntax: values travel as
argv elements and never through a shell, but a ref such as `--output=x` would still be an
option to git, and `a;b` is a typo no one means.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any


from kernels.bundle import LABEL_RULE, is_label
from kernels.names import KV_STRATEGIES, PRESET_NAMES

from .engines.sglang_choices import FLAG_CHOICES, find_choice_problem
from ..limits import MAX_SWEEP_POINTS, MAX_SWEEP_VALUES
from ..user_files import load_user_table
from .errors import SpecError
from .names import DEVICES, ENGINES

OWN_CHECKOUT = Path(__file__).resolve().parents[2]  # this checkout: the reference workload's own repo

_REF = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/@{}~^-]*$")
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SSH_TARGET = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9._-]*@)?[A-Za-z0-9][A-Za-z0-9.:_-]*$")
_FLAG = re.compile(r"^--[a-z0-9][a-z0-9-]*(=[^\s;&|`$<>\\]*)?$")


@dataclass(frozen=True)
class HostConfig:
    name: str
    ssh: str | None = None  # user@host, None for this machine
    port: int = 22
    identity_file: str | None = None
    python: str = "python3"
    workdir: str = "/tmp/stepwatch"
    ssh_options: tuple[str, ...] = ()


# ssh options a host may set: connection, authentication and host-key settings. Options that run
# a local command or load code (ProxyCommand, LocalCommand, KnownHostsCommand, PKCS11Provider,
# SecurityKeyProvider, Match exec, ProxyJump: it starts another ssh), forward ports or agents, or pull in
# other files (Include) are not.
SSH_OPTIONS_SHOWN = (
    "AddressFamily", "BatchMode", "CheckHostIP", "Ciphers", "Compression", "ConnectionAttempts",
    "ConnectTimeout", "ControlMaster", "ControlPath", "ControlPersist", "HostKeyAlgorithms", "HostKeyAlias",
    "HostbasedAuthentication", "IdentitiesOnly", "IPQoS", "KexAlgorithms", "LogLevel", "MACs",
    "PasswordAuthentication", "PreferredAuthentications", "PubkeyAcceptedAlgorithms",
    "PubkeyAuthentication", "ServerAliveCountMax", "ServerAliveInterval", "StrictHostKeyChecking", "TCPKeepAlive",
    "UpdateHostKeys", "UserKnownHostsFile", "VerifyHostKeyDNS",
)
SSH_OPTIONS_ALLOWED = frozenset(o.lower() for o in SSH_OPTIONS_SHOWN)


@dataclass(frozen=True)
class RepoConfig:
    name: str
    path: str  # a git checkout on the host that runs it


@dataclass(frozen=True)
class Config:
    hosts: dict[str, HostConfig] = field(default_factory=dict)
    repos: dict[str, RepoConfig] = field(default_factory=dict)
    patches: dict[str, tuple[str, ...]] = field(default_factory=dict)  # variant name -> files
    source: str | None = None
    # [imports] roots: directories (absolute, resolved) under which the import engine may read a path
    import_roots: tuple[str, ...] = ()

    def host(self, name: str) -> HostConfig:
        if name == "local":
            return self.hosts.get("local", HostConfig("local"))
        if name not in self.hosts:
            raise SpecError(f"host {name!r}: not in the config file ({self.source or 'none given'})")
        return self.hosts[name]


@dataclass(frozen=True)
class Workload:
    preset: str | None = None  # reference engine
    kv: str = "full-pool-cast"  # reference engine: the KV strategy
    cuda_graph: bool = False
    # reference engine, with cuda_graph: also profile the same steps without graphs (the mapping
    # trace that attributes graph kernels to ops, lines and layers; ingest/traces/graph_attribution.py)
    graph_mapping: bool = False
    model_path: str | None = None  # sglang engine
    load_format: str | None = None  # e.g. "dummy": random weights from the model's config
    batch_size: int = 1
    input_len: int = 256
    output_len: int = 32
    context: int | None = None  # reference engine: KV tokens attended per step
    kv_cache_dtype: str | None = None
    attention_backend: str | None = None
    tp: int = 1
    profile_steps: int = 3
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunSpec:
    engine: str
    workload: Workload = field(default_factory=Workload)
    host: str = "local"
    device: str = "cpu"
    repo: str | None = None  # a name from the config's [repos], or "stepwatch" for reference
    repo_path: str | None = None  # a checkout on the host, for a repo the config does not name
    ref: str | None = None  # any git ref; resolved to a full sha before the run
    variant: str = "unpatched"  # "unpatched" or a patch set from the config's [patches]
    path: str | None = None  # import engine: the trace file, directory or bundle
    timeout_s: float = 3600.0
    sweep_id: str | None = None  # the sweep this run is a point of (SweepSpec), None for none
    sweep_point: int | None = None  # its index among the sweep's points

    def to_json(self) -> str:
        body = asdict(self)
        for key in ("sweep_id", "sweep_point"):  # a run of no sweep keeps the JSON it always had
            if body[key] is None:
                del body[key]
        return json.dumps(body, sort_keys=True)

    def describe(self) -> str:
        what = self.workload.preset or self.workload.model_path or self.path or "?"
        where = f" {self.repo or ''}@{self.ref}" if self.ref else (f" {self.repo}" if self.repo else "")
        point = ""
        if self.sweep_id is not None:
            w = self.workload
            if self.engine == "reference":
                shape = f"bs {w.batch_size}" + (f" ctx {w.context}" if w.context else "")
            else:
                shape = f"bs {w.batch_size} in {w.input_len} out {w.output_len}"
            point = f" · sweep {self.sweep_id} point {(self.sweep_point or 0) + 1} ({shape})"
        return f"{self.engine} {what} {self.describe_variant()}{where} on {self.host}/{self.device}{point}"

    def describe_variant(self) -> str:
        """The KV strategy (reference engine; "+graph" under CUDA graphs) or the patch set."""
        if self.engine != "reference":
            return self.variant
        return self.workload.kv + ("+graph" if self.workload.cuda_graph else "")


@dataclass(frozen=True)
class RangeSpec:
    """A job that stands for run jobs a worker queues once it has found their commits, so that
    whoever queues it (the dashboard's form) needs no git, host or checkout. `runs` are run spec
    bodies, one a variant x execution mode, without repo, repo_path or ref. The worker
    (ingest/runs/expand.py) finds the checkout `repo` names on `host`, lists `commits` in it (A..B:
    B's first-parent history after A, every `every`-th commit and always B; a single ref, or ""
    for HEAD, is kept as it is), and queues one job a commit x run, commits outer, in batch
    `batch`. Stored in the job queue as {"expand": {...}}."""

    commits: str  # A..B, one ref, or "" (HEAD)
    repo: str  # a config [repos] name, or "" or "stepwatch" (this checkout)
    runs: tuple[dict, ...]
    host: str = "local"
    every: int = 1
    batch: str = ""

    def to_json(self) -> str:
        return json.dumps({"expand": asdict(self)}, sort_keys=True)


# The workload fields a sweep may list, by engine, in the order their combinations are run (the
# first outermost): SGLang's one-batch benchmark loops `itertools.product(batch_size, input_len,
# output_len)` (sglang 0.5.23 python/sglang/benchmark/one_batch.py latency_test); the reference
# workload reads batch_size and context (the KV tokens a step attends), not input_len or output_len.
SWEEP_AXES = {"reference": ("batch_size", "context"), "sglang": ("batch_size", "input_len", "output_len")}
_SWEEP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class SweepSpec:
    """A run spec whose workload lists some of its SWEEP_AXES: one run a combination (`points`,
    each a RunSpec of one batch size / length, of its own series as any run, with `sweep_id` and
    its index `sweep_point`), in the order SGLang's one-batch benchmark runs them (the first axis
    outermost). `axes` holds the listed fields and their values as given. The sglang engine at TP
    1 runs every point in ONE process of its one-batch benchmark (`in_one_process`, one job);
    every other sweep is one job a point, each its own process as any run."""

    sweep_id: str
    axes: tuple[tuple[str, tuple[int, ...]], ...]
    points: tuple[RunSpec, ...]

    @property
    def in_one_process(self) -> bool:
        return self.points[0].engine == "sglang" and self.points[0].workload.tp == 1

    def to_json(self) -> str:
        """The spec as it was given (the listed fields as lists) with its sweep id: what a job row holds."""
        body = json.loads(self.points[0].to_json())
        del body["sweep_point"]
        body["workload"].update({key: list(values) for key, values in self.axes})
        return json.dumps(body, sort_keys=True)

    def describe_axes(self) -> str:
        """e.g. "batch_size 1, 8, 32 x input_len 1024, 4096"."""
        return " x ".join(f"{key} {', '.join(map(str, values))}" for key, values in self.axes)

    def describe(self) -> str:
        first = self.points[0]
        base = first.describe().split(" · sweep ")[0]
        return f"{base} · sweep {self.sweep_id} of {len(self.points)} points ({self.describe_axes()})"

    def list_jobs(self) -> list[tuple[str, str]]:
        """(spec JSON, label) of each job the sweep is queued as: one for an in-process sweep, else one a point."""
        if self.in_one_process:
            return [(self.to_json(), self.describe())]
        n = len(self.points)
        return [(p.to_json(), p.describe().replace(f"point {i + 1} (", f"point {i + 1} of {n} (", 1))
                for i, p in enumerate(self.points)]


def list_spec_jobs(spec: "RunSpec | SweepSpec") -> list[tuple[str, str]]:
    """(spec JSON, label) of each job a run spec or a sweep is queued as."""
    return spec.list_jobs() if isinstance(spec, SweepSpec) else [(spec.to_json(), spec.describe())]


def new_sweep_id() -> str:
    """A fresh sweep id: 'sweep-' and 12 hex digits."""
    return f"sweep-{uuid.uuid4().hex[:12]}"


def is_sweep_body(body: Any) -> bool:
    """Whether a spec body's workload lists a field (a sweep), by its shape alone."""
    workload = body.get("workload") if isinstance(body, dict) else None
    return isinstance(workload, dict) and any(isinstance(v, (list, tuple)) for k, v in workload.items()
                                              if k != "extra_args")


def parse_sweep(body: Any, config: Config | None = None, where: str = "spec") -> SweepSpec:
    """Check a spec whose workload lists batch sizes / lengths; raise SpecError naming the first
    bad field: a list of a field the engine does not sweep, an empty list, a value given twice
    (refused, not folded: a doubled point is a typo more often than a wish for a repeat, which
    --repeat asks for), more than MAX_SWEEP_VALUES values or MAX_SWEEP_POINTS combinations, or a
    point that parse_spec refuses. Without a `sweep_id` the sweep gets a new one."""
    _need(isinstance(body, dict), where, "must be a table/object")
    workload = body.get("workload")
    _need(isinstance(workload, dict), f"{where}.workload", "must be a table/object")
    engine = body.get("engine")
    _need(engine in ENGINES, f"{where}.engine", f"{engine!r} is not one of {', '.join(ENGINES)}")
    allowed = SWEEP_AXES.get(engine, ())
    listed = [k for k, v in workload.items() if k != "extra_args" and isinstance(v, (list, tuple))]
    for key in listed:
        if key not in allowed:
            hint = {"reference": "the reference engine reads batch_size and context (the KV tokens a step attends), "
                                 f"not {key}",
                    "sglang": f"the sglang engine sweeps {', '.join(allowed)}"}.get(engine, f"the {engine} engine "
                                                                                       "runs no sweep")
            raise SpecError(f"{where}.workload.{key}: a list makes a sweep, and {hint}")
    axes = []
    for key in allowed:
        if key not in listed:
            continue
        values = list(workload[key])
        _need(bool(values), f"{where}.workload.{key}", "an empty list: give at least one value")
        _need(len(values) <= MAX_SWEEP_VALUES, f"{where}.workload.{key}",
              f"{len(values)} values, more than MAX_SWEEP_VALUES ({MAX_SWEEP_VALUES}, ingest/limits.py)")
        for value in values:
            _positive_int({key: value}, key, f"{where}.workload", None)
        twice = sorted({v for v in values if values.count(v) > 1})
        _need(not twice, f"{where}.workload.{key}",
              f"{', '.join(map(str, twice))} given more than once: each value once (use repeats for more runs)")
        axes.append((key, tuple(values)))
    count = 1
    for _, values in axes:
        count *= len(values)
    _need(count <= MAX_SWEEP_POINTS, f"{where}.workload",
          f"{' x '.join(str(len(v)) for _, v in axes)} = {count} combinations, more than MAX_SWEEP_POINTS "
          f"({MAX_SWEEP_POINTS}, ingest/limits.py)")
    sweep_id = body.get("sweep_id") or new_sweep_id()
    _need(isinstance(sweep_id, str) and _SWEEP_ID.fullmatch(sweep_id) is not None, f"{where}.sweep_id",
          f"{sweep_id!r}: letters, digits and ._- (at most 64, not starting with one of ._-)")
    _need("sweep_point" not in body, f"{where}.sweep_point", "set for each point, not given")
    points = []
    for i, combo in enumerate(itertools.product(*(values for _, values in axes))):
        point = {**body, "workload": {**workload, **dict(zip((k for k, _ in axes), combo))},
                 "sweep_id": sweep_id, "sweep_point": i}
        points.append(parse_spec(point, config, where))
    return SweepSpec(sweep_id, tuple(axes), tuple(points))


def parse_any_spec(body: Any, config: Config | None = None, where: str = "spec") -> RunSpec | SweepSpec:
    """A run spec, or a SweepSpec when its workload lists a field."""
    return parse_sweep(body, config, where) if is_sweep_body(body) else parse_spec(body, config, where)


def parse_rerun_spec(body: Any, sweep_point: int | None, config: Config | None = None) -> RunSpec:
    """The spec that runs a run's point again, from its job's spec: the point `sweep_point` of a
    sweep job, or the job's own spec, without its sweep (a re-run at another commit is no point
    of the sweep it came from)."""
    spec = parse_any_spec(body, config)
    if isinstance(spec, SweepSpec):
        if sweep_point is None or not 0 <= sweep_point < len(spec.points):
            raise SpecError(f"spec.sweep_point: {sweep_point!r} is not a point of sweep {spec.sweep_id} "
                            f"({len(spec.points)} points)")
        spec = spec.points[sweep_point]
    return replace(spec, sweep_id=None, sweep_point=None)


def _need(cond: bool, where: str, message: str) -> None:
    if not cond:
        raise SpecError(f"{where}: {message}")


def check_ref(ref: str, where: str = "ref") -> str:
    _need(isinstance(ref, str) and bool(ref), where, "must be a non-empty string")
    _need(not ref.startswith("-"), where, f"{ref!r} looks like an option")
    _need(_REF.fullmatch(ref) is not None and ".." not in ref and len(ref) <= 200, where,
          f"{ref!r} is not a git ref (letters, digits and ._/@{{}}~^- only)")
    return ref


def check_label(value: str, where: str) -> str:
    """A repo, variant, host or patch-set name: the one label rule of every door (kernels.bundle's, as
    `ingest import --variant`, a bundle's manifest and a merge apply it), so `fix/a` is a variant
    whichever way it comes in. Where a label becomes part of a file name, the caller makes it safe."""
    _need(is_label(value), where, f"{str(value)[:80]!r}: {LABEL_RULE}")
    return value


# The largest value each workload number may take, whichever door a spec came through (a spec
# file, `ingest run` flags, the form, which also uses these as its inputs' maxima). Profiled
# steps bound the trace: a glm5 step with stacks is ~5 MB of JSON.
WORKLOAD_MAXIMA = {"batch_size": 4096, "input_len": 1 << 20, "output_len": 1 << 20, "tp": 64,
                   "profile_steps": 1000, "context": 1 << 22}


def _positive_int(body: dict, key: str, where: str, default: int | None) -> int | None:
    value = body.get(key, default)
    if value is None:
        return None
    _need(isinstance(value, int) and not isinstance(value, bool) and value > 0, f"{where}.{key}",
          f"must be a positive integer, got {value!r}")
    _need(value <= WORKLOAD_MAXIMA[key], f"{where}.{key}",
          f"must be at most {WORKLOAD_MAXIMA[key]:,} (WORKLOAD_MAXIMA), got {value:,}")
    return value


def parse_workload(body: Any, engine: str, where: str = "workload") -> Workload:
    body = body or {}
    _need(isinstance(body, dict), where, "must be a table/object")
    known = set(Workload.__dataclass_fields__)
    unknown = set(body) - known
    _need(not unknown, where, f"unknown field(s) {', '.join(sorted(unknown))}")
    ints = {k: _positive_int(body, k, where, getattr(Workload, k, None))
            for k in ("batch_size", "input_len", "output_len", "tp", "profile_steps", "context")}
    for key in ("preset", "kv", "model_path", "load_format", "kv_cache_dtype", "attention_backend"):
        if body.get(key) is not None:
            _need(isinstance(body[key], str) and body[key] != "", f"{where}.{key}", "must be a non-empty string")
            _need(not body[key].startswith("-"), f"{where}.{key}", f"{body[key]!r} looks like an option")
    for key in ("preset", "kv", "load_format", "kv_cache_dtype", "attention_backend"):
        if body.get(key) is not None:
            check_label(body[key], f"{where}.{key}")
    if body.get("model_path") is not None:
        _need(re.fullmatch(r"[A-Za-z0-9._/@:+-]+", body["model_path"]) is not None, f"{where}.model_path",
              f"{body['model_path']!r}: a path or model name without spaces or shell characters")
    cuda_graph = body.get("cuda_graph", False)
    _need(isinstance(cuda_graph, bool), f"{where}.cuda_graph", "must be true or false")
    graph_mapping = body.get("graph_mapping", False)
    _need(isinstance(graph_mapping, bool), f"{where}.graph_mapping", "must be true or false")
    _need(not graph_mapping or cuda_graph, f"{where}.graph_mapping",
          "needs cuda_graph true (the mapping trace is the graph-off twin of a graph run)")
    _need(not graph_mapping or engine == "reference", f"{where}.graph_mapping",
          "only the reference engine makes a mapping trace in the same job; for SGLang run the spec again "
          "with --disable-cuda-graph and import the graph run with --mapping")
    extra = body.get("extra_args", [])
    _need(isinstance(extra, list) and all(isinstance(a, str) for a in extra), f"{where}.extra_args",
          "must be a list of strings")
    for arg in extra:
        _need(_FLAG.fullmatch(arg) is not None, f"{where}.extra_args",
              f"{arg!r}: each entry must be one --flag or --flag=value without spaces or shell characters")
    if engine == "reference":
        _need(body.get("preset") in PRESET_NAMES, f"{where}.preset",
              f"{body.get('preset')!r} is not one of {', '.join(PRESET_NAMES)}")
        _need(body.get("kv", "full-pool-cast") in KV_STRATEGIES, f"{where}.kv",
              f"{body.get('kv')!r} is not one of {', '.join(KV_STRATEGIES)}")
    if engine == "sglang":
        _need(bool(body.get("model_path")), f"{where}.model_path", "the sglang engine needs a model path")
        for key in FLAG_CHOICES:
            if body.get(key) is not None:
                problem = find_choice_problem(key, body[key])
                _need(problem is None, f"{where}.{key}", problem or "")
    return Workload(
        preset=body.get("preset"), kv=body.get("kv", "full-pool-cast"), cuda_graph=cuda_graph,
        graph_mapping=graph_mapping,
        model_path=body.get("model_path"), load_format=body.get("load_format"),
        kv_cache_dtype=body.get("kv_cache_dtype"), attention_backend=body.get("attention_backend"),
        extra_args=tuple(extra), **ints,
    )


def parse_spec(body: Any, config: Config | None = None, where: str = "spec") -> RunSpec:
    """Check a spec given as a dict; raise SpecError naming the first bad field."""
    config = config or Config()
    _need(isinstance(body, dict), where, "must be a table/object")
    unknown = set(body) - set(RunSpec.__dataclass_fields__)
    _need(not unknown, where, f"unknown field(s) {', '.join(sorted(unknown))}")
    engine = body.get("engine")
    _need(engine in ENGINES, f"{where}.engine", f"{engine!r} is not one of {', '.join(ENGINES)}")
    host = body.get("host", "local")
    _need(isinstance(host, str) and _HOST.fullmatch(host) is not None, f"{where}.host", f"{host!r} is not a host name")
    config.host(host)
    device = body.get("device", "cpu")
    _need(device in DEVICES, f"{where}.device", f"{device!r} is not one of {', '.join(DEVICES)}")
    variant = check_label(body.get("variant", "unpatched"), f"{where}.variant")
    if variant != "unpatched":
        _need(engine == "sglang", f"{where}.variant", "patch sets apply to the sglang engine only")
        _need(variant in config.patches, f"{where}.variant",
              f"{variant!r} is not a patch set in the config file ({config.source or 'none given'})")
        for f in config.patches[variant]:
            _need(Path(f).is_file(), f"{where}.variant", f"patch file {f} of {variant!r} does not exist")
    repo = body.get("repo")
    repo_path = body.get("repo_path")
    if repo_path is not None:
        _need(isinstance(repo_path, str) and re.fullmatch(r"/[A-Za-z0-9._/+@-]*", repo_path) is not None,
              f"{where}.repo_path", f"{repo_path!r} is not an absolute plain path")
        _need(repo is not None, f"{where}.repo", "a repo_path needs a repo name")
    ref = body.get("ref")
    if ref is not None:
        check_ref(ref, f"{where}.ref")
    if repo is not None:
        check_label(repo, f"{where}.repo")
    if engine == "sglang":
        _need(repo is not None, f"{where}.repo", "the sglang engine needs a repo from the config's [repos]")
        _need(ref is not None, f"{where}.ref", "the sglang engine needs a ref (commit, tag or branch)")
    if engine != "import":
        find_code_problem(engine, repo, repo_path, config, where)
    path = body.get("path")
    if engine == "import":
        _need(isinstance(path, str) and bool(path), f"{where}.path", "the import engine needs a path")
        _need(Path(path).exists(), f"{where}.path", f"{path}: no such file or directory")
        find_import_problem(path, config, where)
    timeout = body.get("timeout_s", 3600.0)
    _need(isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout <= 86400,
          f"{where}.timeout_s", "must be a number of seconds between 0 and 86400")
    sweep_id, sweep_point = body.get("sweep_id"), body.get("sweep_point")
    if sweep_id is not None or sweep_point is not None:
        _need(isinstance(sweep_id, str) and _SWEEP_ID.fullmatch(sweep_id) is not None, f"{where}.sweep_id",
              f"{sweep_id!r}: letters, digits and ._- (at most 64, not starting with one of ._-)")
        _need(isinstance(sweep_point, int) and not isinstance(sweep_point, bool)
              and 0 <= sweep_point < MAX_SWEEP_POINTS, f"{where}.sweep_point",
              f"{sweep_point!r}: a point's index, 0 to {MAX_SWEEP_POINTS - 1}")
    if is_sweep_body(body):
        key = next(k for k, v in body["workload"].items() if isinstance(v, (list, tuple)) and k != "extra_args")
        raise SpecError(f"{where}.workload.{key}: a list makes a sweep, which is queued as one run a combination "
                        "(`ingest run`, `ingest backfill` or the form), not here")
    return RunSpec(engine=engine, workload=parse_workload(body.get("workload"), engine, f"{where}.workload"),
                   host=host, device=device, repo=repo, repo_path=repo_path, ref=ref, variant=variant, path=path,
                   timeout_s=float(timeout), sweep_id=sweep_id, sweep_point=sweep_point)


def _same_checkout(a: str, b: str | Path) -> bool:
    """Whether two paths name one checkout: the same text once normalised (a path on a remote
    host), or the same directory here once links are resolved."""
    if os.path.normpath(a) == os.path.normpath(str(b)):
        return True
    return os.path.realpath(a) == os.path.realpath(b)


def find_code_problem(engine: str, repo: str | None, repo_path: str | None, config: Config,
                      where: str = "spec") -> None:
    """Refuse code the config does not name: the repo must be one of the config's [repos] (its
    repo_path, if given, that entry's own checkout), or, for the reference engine, this checkout
    (no repo, "stepwatch", or repo_path OWN_CHECKOUT). Raises SpecError naming the repo."""
    source = config.source or "no config file"
    if repo in config.repos:
        if repo_path is not None:
            _need(_same_checkout(repo_path, config.repos[repo].path), f"{where}.repo_path",
                  f"{repo_path} is not the checkout the config names for {repo!r} ({config.repos[repo].path}, "
                  f"in {source}): stepwatch runs code only from the checkouts the config names")
        return
    if engine == "reference" and repo in (None, "stepwatch") and (repo_path is None
                                                                   or _same_checkout(repo_path, OWN_CHECKOUT)):
        return
    if repo_path is not None:
        raise SpecError(f"{where}.repo_path: {repo_path} is not a checkout the config names in [repos] ({source}): "
                        "stepwatch runs code only from the repositories the config names"
                        + (", or its own checkout" if engine == "reference" else ""))
    own = " (or, for the reference engine, leave it out or give 'stepwatch': this checkout)"
    raise SpecError(f"{where}.repo: {repo!r} is not in the config's [repos] ({source}): stepwatch runs code only "
                    f"from the repositories the config names{own if engine == 'reference' else ''}")


def find_import_problem(path: str, config: Config, where: str = "spec") -> None:
    """Refuse an import engine path outside the config's `[imports] roots` (resolved, links
    followed: a link under a root that leads out of it is outside). Raises SpecError."""
    real = os.path.realpath(path)
    if any(real == root or real.startswith(root.rstrip("/") + "/") for root in config.import_roots):
        return
    roots = ", ".join(config.import_roots) or "none set"
    raise SpecError(f"{where}.path: {path} is not under a directory the config allows the import engine to read "
                    f"([imports] roots in {config.source or 'no config file'}: {roots})")


def place_at_commit(body: dict, repo: str | None, ref: str | None, repo_path: str | None = None) -> dict:
    """A run spec body with its repo, the repo's checkout path and its ref set (each only when given)."""
    placed = dict(body)
    for key, value in (("repo", repo), ("repo_path", repo_path), ("ref", ref)):
        if value:
            placed[key] = value
    return placed


_RANGE_FIELDS = ("commits", "repo", "runs", "host", "every", "batch")


def check_commits(commits: str, where: str = "ref") -> str:
    """A range A..B (each end a ref), one ref, or "" (HEAD); checked as refs are, by spelling only."""
    _need(isinstance(commits, str), where, "must be a string")
    if ".." in commits:
        start, _, end = commits.partition("..")
        check_ref(start, where)
        check_ref(end, where)
    elif commits:
        check_ref(commits, where)
    return commits


def parse_range_spec(body: Any, config: Config | None = None, where: str = "spec.expand") -> RangeSpec:
    """Check a RangeSpec given as a dict; raise SpecError naming the first bad field. A run body is
    checked as a whole spec (parse_spec) where its repo and commit are known: by the worker, as it
    expands the range (and by the form, at the range's last ref, before queueing it)."""
    config = config or Config()
    _need(isinstance(body, dict), where, "must be a table/object")
    unknown = set(body) - set(_RANGE_FIELDS)
    _need(not unknown, where, f"unknown field(s) {', '.join(sorted(unknown))}")
    check_commits(body.get("commits", ""), f"{where}.commits")
    repo = body.get("repo", "")
    _need(isinstance(repo, str) and (repo in ("", "stepwatch") or repo in config.repos), f"{where}.repo",
          f"{repo!r} is not in the config's [repos] ({config.source or 'no config file'}): stepwatch runs code only "
          "from the repositories the config names, or its own checkout ('' or 'stepwatch')")
    runs = body.get("runs")
    _need(isinstance(runs, list) and bool(runs) and all(isinstance(r, dict) for r in runs), f"{where}.runs",
          "must be a non-empty list of run spec tables/objects")
    for run in runs:
        placed = sorted({"repo", "repo_path", "ref", "sweep_id", "sweep_point"} & set(run))
        _need(not placed, f"{where}.runs", f"{', '.join(placed)}: set by the worker for each commit, not given")
    host = body.get("host", "local")
    _need(isinstance(host, str) and _HOST.fullmatch(host) is not None, f"{where}.host", f"{host!r} is not a host name")
    config.host(host)
    every = body.get("every", 1)
    _need(isinstance(every, int) and not isinstance(every, bool) and every > 0, f"{where}.every",
          f"must be a positive integer, got {every!r}")
    batch = body.get("batch", "")
    _need(isinstance(batch, str), f"{where}.batch", "must be a string")
    return RangeSpec(commits=body.get("commits", ""), repo=repo, runs=tuple(runs), host=host, every=every,
                     batch=batch)


def parse_job_spec(body: Any, config: Config | None = None) -> RunSpec | RangeSpec | SweepSpec:
    """A queued job's spec: a RangeSpec when it is {"expand": {...}}, a SweepSpec when its workload
    lists a field (an in-process sweep), else a run spec."""
    if isinstance(body, dict) and "expand" in body:
        _need(set(body) == {"expand"}, "spec", "a range job holds only its 'expand' table/object")
        return parse_range_spec(body["expand"], config)
    return parse_any_spec(body, config)


def _read_table_file(path: Path) -> dict:
    """A config or spec file's table: a regular file, size and depth limited (ingest/user_files.py)."""
    return load_user_table(path, SpecError)


def load_config(path: str | Path | None) -> Config:
    """Read a config file ([hosts.NAME], [repos.NAME], [patches.NAME], [imports] roots); None gives an empty one."""
    if path is None:
        return Config()
    path = Path(path)
    body = _read_table_file(path)
    unknown = set(body) - {"hosts", "repos", "patches", "imports"}
    _need(not unknown, str(path), f"unknown section(s) {', '.join(sorted(unknown))}")
    hosts = {}
    for name, h in body.get("hosts", {}).items():
        where = f"{path}: hosts.{name}"
        _need(_HOST.fullmatch(name) is not None, where, "bad host name")
        _need(isinstance(h, dict), where, "must be a table")
        bad = set(h) - {"ssh", "port", "identity_file", "python", "workdir", "ssh_options"}
        _need(not bad, where, f"unknown field(s) {', '.join(sorted(bad))}")
        ssh = h.get("ssh")
        _need(ssh is None or (isinstance(ssh, str) and _SSH_TARGET.fullmatch(ssh) is not None), f"{where}.ssh",
              f"{ssh!r} is not user@host")
        port = h.get("port", 22)
        _need(isinstance(port, int) and 0 < port < 65536, f"{where}.port", "must be a port number")
        opts = h.get("ssh_options", [])
        _need(isinstance(opts, list) and all(isinstance(o, str) and re.fullmatch(r"[A-Za-z]+=[^\s;&|`$]+", o)
                                             for o in opts), f"{where}.ssh_options",
              "must be a list of Key=value ssh options")
        refused = [o.split("=", 1)[0] for o in opts if o.split("=", 1)[0].lower() not in SSH_OPTIONS_ALLOWED]
        _need(not refused, f"{where}.ssh_options",
              f"{', '.join(refused)} not allowed: only options that run no command and load no code "
              f"({', '.join(sorted(SSH_OPTIONS_SHOWN))})")
        for key in ("python", "workdir", "identity_file"):
            if h.get(key) is not None:
                _need(isinstance(h[key], str) and re.fullmatch(r"[A-Za-z0-9._/~+-]+", h[key]) is not None
                      and not h[key].startswith("-"), f"{where}.{key}", f"{h[key]!r} is not a plain path")
        hosts[name] = HostConfig(name, ssh, port, h.get("identity_file"), h.get("python", "python3"),
                                 h.get("workdir", "/tmp/stepwatch"), tuple(opts))
    repos = {}
    for name, r in body.get("repos", {}).items():
        where = f"{path}: repos.{name}"
        check_label(name, where)
        _need(isinstance(r, dict) and isinstance(r.get("path"), str) and r["path"], f"{where}.path",
              "must be the path of a git checkout")
        repos[name] = RepoConfig(name, r["path"])
    patches = {}
    for name, p in body.get("patches", {}).items():
        where = f"{path}: patches.{name}"
        check_label(name, where)
        _need(name != "unpatched", where, "'unpatched' is the variant without patches")
        files = p.get("files") if isinstance(p, dict) else None
        _need(isinstance(files, list) and files and all(isinstance(f, str) for f in files), f"{where}.files",
              "must be a non-empty list of patch files")
        resolved = tuple(str((path.parent / f).resolve()) if not Path(f).is_absolute() else f for f in files)
        for f in resolved:
            _need(Path(f).is_file(), f"{where}.files", f"{f}: no such patch file")
        patches[name] = resolved
    return Config(hosts, repos, patches, str(path), _read_import_roots(body.get("imports", {}), path))


def _read_import_roots(imports: Any, path: Path) -> tuple[str, ...]:
    """`[imports] roots = ["/data/traces", ...]`: absolute directories (resolved, links followed),
    under which `ingest run --engine import --path P` and the form's import may read P."""
    where = f"{path}: imports"
    _need(isinstance(imports, dict), where, "must be a table")
    bad = set(imports) - {"roots"}
    _need(not bad, where, f"unknown field(s) {', '.join(sorted(bad))}")
    roots = imports.get("roots", [])
    _need(isinstance(roots, list) and all(isinstance(r, str) and os.path.isabs(r) for r in roots), f"{where}.roots",
          "must be a list of absolute directory paths")
    for root in roots:
        _need(os.path.isdir(root), f"{where}.roots", f"{root}: no such directory")
    return tuple(os.path.realpath(r) for r in roots)

