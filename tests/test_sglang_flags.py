"""Every flag the sglang engine can pass exists in a real SGLang release's argparse definitions.

The sources come from the sglang 0.5.23 wheel, fetched once into ~/.cache/stepwatch/ (or
$STEPWATCH_CACHE, or taken from $STEPWATCH_SGLANG_WHEEL) by the session fixture `sglang_wheel`
(tests/conftest.py): it skips only when the package index cannot be reached and fails on
any other download problem. The flags are read with `ast`, never by importing SGLang (it cannot be
installed here, FACTS.md section 4):

- `add_argument("--flag", "--alias", ...)` calls in the benchmark module and in
  `sglang/srt/server_args.py`;
- the server arguments sglang 0.5.23 derives from annotated fields
  (`sglang/srt/arg_groups/arg_utils.py:add_cli_args_from_dataclass`): a field
  `tp_size: A[int, Arg(help=..., aliases=["--tensor-parallel-size"])]` in a class under
  `sglang/srt/arg_groups/fields/` is the flag `--tp-size` (or `Arg(cli_name=...)`) plus its
  aliases, unless `Arg(no_cli=True)`; a field whose annotation carries no `Arg` or help string
  gets no flag;
- the choices of those flags: `Arg(choices=[...])`, or `Arg(choices=NAME)` with NAME a list of
  `sglang/srt/arg_groups/choices.py`, which the engine's own lists
  (ingest/runs/engines/sglang_choices.py, checked when a spec is parsed) must equal.
"""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest

from ingest.runs.engines.sglang import (
    LAUNCH_SERVER_FILE,
    BenchFlags,
    build_one_batch_argv,
    build_profile_request,
    build_server_argv,
    detect_bench_flags,
    find_bench_module,
)
from ingest.runs.engines.sglang_choices import FLAG_CHOICES
from ingest.runs.errors import SpecError
from ingest.runs.spec import Workload, parse_workload

SERVER_ARGS = "sglang/srt/server_args.py"
FIELDS_DIR = "sglang/srt/arg_groups/fields/"
CHOICES = "sglang/srt/arg_groups/choices.py"
IO_STRUCT = "sglang/srt/managers/io_struct.py"
HTTP_SERVER = "sglang/srt/entrypoints/http_server.py"
SAMPLING_PARAMS = "sglang/srt/sampling/sampling_params.py"
PROFILER_MANAGER = "sglang/srt/managers/scheduler_components/profiler_manager.py"


def _string_args(call: ast.Call) -> list[str]:
    return [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]


def collect_add_argument_flags(source: str) -> dict[str, ast.Call]:
    """Every `--flag` named in an `add_argument(...)` call, with the call."""
    flags = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            for name in _string_args(node):
                if name.startswith("--"):
                    flags[name] = node
    return flags


def _keyword(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _field_flags(name: str, annotation: ast.expr) -> list[str]:
    """The flags add_cli_args_from_dataclass registers for one annotated field."""
    if not (isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name)
            and annotation.value.id in ("A", "Annotated") and isinstance(annotation.slice, ast.Tuple)):
        return []
    for meta in annotation.slice.elts[1:]:
        if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
            return ["--" + name.replace("_", "-")]
        if isinstance(meta, ast.Call) and isinstance(meta.func, ast.Name) and meta.func.id == "Arg":
            no_cli = _keyword(meta, "no_cli")
            if isinstance(no_cli, ast.Constant) and no_cli.value is True:
                return []
            cli_name = _keyword(meta, "cli_name")
            flags = [cli_name.value if isinstance(cli_name, ast.Constant) else "--" + name.replace("_", "-")]
            aliases = _keyword(meta, "aliases")
            if isinstance(aliases, (ast.List, ast.Tuple)):
                flags += [e.value for e in aliases.elts if isinstance(e, ast.Constant)]
            return flags
    return []


def collect_field_flags(source: str) -> set[str]:
    """Flags of every annotated field of every class in a module."""
    flags = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    flags.update(_field_flags(stmt.target.id, stmt.annotation))
    return flags


def collect_named_lists(source: str) -> dict[str, list]:
    """Module-level `NAME = [literal, ...]` assignments (choices.py's lists)."""
    named = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple)):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    named[target.id] = ast.literal_eval(node.value)
    return named


def _choices_of(node: ast.expr | None, named: dict[str, list]) -> list | None:
    if isinstance(node, (ast.List, ast.Tuple)):
        return ast.literal_eval(node)
    if isinstance(node, ast.Name):
        return named.get(node.id)
    return None


def collect_field_choices(source: str, named: dict[str, list]) -> dict[str, list]:
    """Flag -> choices, for every annotated field whose `Arg(...)` names its choices."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(stmt.annotation, ast.Subscript) and isinstance(stmt.annotation.slice, ast.Tuple)):
                continue
            for meta in stmt.annotation.slice.elts[1:]:
                if isinstance(meta, ast.Call) and isinstance(meta.func, ast.Name) and meta.func.id == "Arg":
                    choices = _choices_of(_keyword(meta, "choices"), named)
                    if choices is not None:
                        for flag in _field_flags(stmt.target.id, stmt.annotation):
                            found[flag] = choices
    return found


@pytest.fixture(scope="module")
def release(sglang_wheel: Path) -> dict[str, str]:
    """The wheel's Python sources that define command-line flags, by path."""
    with zipfile.ZipFile(sglang_wheel) as whl:
        names = set(whl.namelist())
        module = find_bench_module(lambda p: p.removeprefix("python/") in names)
        module_file = module.replace(".", "/") + ".py"
        server_files = (IO_STRUCT, HTTP_SERVER, SAMPLING_PARAMS, PROFILER_MANAGER)
        missing = [f for f in server_files if f not in names]
        assert not missing, f"the wheel lacks {missing}: the server path's contract moved"
        wanted = [n for n in names if n in (SERVER_ARGS, CHOICES, module_file, *server_files)
                  or (n.startswith(FIELDS_DIR) and n.endswith(".py"))]
        sources = {n: whl.read(n).decode() for n in wanted}
        sources["has_launch_server"] = LAUNCH_SERVER_FILE.removeprefix("python/") in names
    sources["module"] = module
    sources["module_file"] = module_file
    return sources


@pytest.fixture(scope="module")
def known_flags(release) -> set[str]:
    flags = set(collect_add_argument_flags(release[release["module_file"]]))
    flags |= set(collect_add_argument_flags(release[SERVER_ARGS]))
    for path, text in release.items():
        if path.startswith(FIELDS_DIR) or path == SERVER_ARGS:
            flags |= collect_field_flags(text)
    return flags


def _every_flag_argv(module: str) -> list[str]:
    """The engine's command line with every optional part switched on."""
    workload = Workload(model_path="/models/m", load_format="dummy", kv_cache_dtype="fp8_e4m3",
                        attention_backend="flashinfer", tp=2, batch_size=1, input_len=16, output_len=8,
                        profile_steps=3)
    return build_one_batch_argv("python3", module, workload, result_file="r.jsonl", run_name="n",
                                profile_prefix="p", flags=BenchFlags())


def _class_fields(source: str, name: str) -> set[str]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    raise LookupError(f"no class {name}")


def test_the_release_has_the_current_module_only(release):
    assert release["module"] == "sglang.benchmark.one_batch"


def test_collector_reads_the_release(known_flags):
    # Not vacuous: flags from add_argument calls, from fields, and field aliases are all there.
    for flag in ("--profile-stage", "--result-filename", "--model-path", "--model", "--tensor-parallel-size",
                 "--mem-fraction-static", "--disable-cuda-graph", "--config"):
        assert flag in known_flags, flag
    assert len(known_flags) > 300


def test_every_flag_the_engine_passes_exists(release, known_flags):
    argv = _every_flag_argv(release["module"])
    passed = [a for a in argv if a.startswith("--")]
    missing = [f for f in passed if f not in known_flags]
    assert not missing, f"sglang 0.5.23 has no {missing}"


def test_detection_sees_every_profiling_flag_of_the_release(release):
    assert detect_bench_flags(release[release["module_file"]]) == BenchFlags()


def test_profile_stage_accepts_decode(release):
    call = collect_add_argument_flags(release[release["module_file"]])["--profile-stage"]
    choices = _keyword(call, "choices")
    assert "decode" in ast.literal_eval(choices)


def test_tp_flag_is_tp_size_not_tp(known_flags):
    # FACTS.md section 4 writes `--tp`: in 0.5.23 no such flag is declared (the field is tp_size,
    # alias --tensor-parallel-size); `--tp` only works through argparse's prefix abbreviation,
    # which any new `--tp...` flag would make ambiguous. The engine passes `--tp-size`.
    assert "--tp-size" in known_flags and "--tp" not in known_flags


def test_every_server_flag_exists(release, known_flags):
    argv = build_server_argv("python3", Workload(model_path="m", tp=8, load_format="dummy", kv_cache_dtype="fp8_e4m3",
                                                 attention_backend="flashinfer"))
    passed = [a for a in argv if a.startswith("--")] + ["--host", "--port"]  # the driver adds these two
    missing = [f for f in passed if f not in known_flags]
    assert release["has_launch_server"] and not missing, f"sglang 0.5.23 has no {missing}"


def test_server_http_contract(release):
    """The routes, request fields and trace names the server driver relies on."""
    routes = release[HTTP_SERVER]
    for route in ("/health", "/generate", "/start_profile", "/stop_profile"):
        assert f'"{route}"' in routes, route
    request = build_profile_request("/tmp/p", 3, "stepwatch", "id")
    assert set(request) <= _class_fields(release[IO_STRUCT], "ProfileReq")
    assert {"input_ids", "sampling_params", "stream"} <= _class_fields(release[IO_STRUCT], "GenerateReqInput")
    assert {"max_new_tokens", "ignore_eos", "temperature"} <= _class_fields(release[SAMPLING_PARAMS], "SamplingParams")
    # profiler_manager._stop_profile: [prefix-]{profile_id}-TP-{rank}[-...][-{stage.name}].trace.json.gz
    manager = release[PROFILER_MANAGER]
    for piece in ('stage_prefix = self.profile_prefix + "-"', 'f"TP-{get_parallel().tp_rank}"',
                  'stage_suffix = f"-{stage.name}" if stage else ""', '+ ".trace.json.gz"'):
        assert piece in manager, piece



@pytest.fixture(scope="module")
def release_choices(release) -> dict[str, list]:
    """Flag -> the values sglang 0.5.23 accepts, from its fields and its add_argument calls."""
    named = collect_named_lists(release[CHOICES])
    found = {}
    for path, text in release.items():
        if path.startswith(FIELDS_DIR):
            found.update(collect_field_choices(text, named))
    for path in (SERVER_ARGS, release["module_file"]):
        for flag, call in collect_add_argument_flags(release[path]).items():
            choices = _choices_of(_keyword(call, "choices"), named)
            if choices is not None:
                found[flag] = choices
    return found


def test_choice_collector_reads_the_release(release_choices):
    # Not vacuous: a literal list (kv_cache_dtype, fields/model.py:197) and lists named from
    # choices.py (LOAD_FORMAT_CHOICES :3, ATTENTION_BACKEND_CHOICES :69).
    assert "fp8_e4m3" in release_choices["--kv-cache-dtype"] and "fp8" not in release_choices["--kv-cache-dtype"]
    assert "dummy" in release_choices["--load-format"] and "fa3" in release_choices["--attention-backend"]


def test_our_choice_lists_equal_the_release(release_choices):
    """The lists a spec is checked against (ingest/runs/engines/sglang_choices.py) are the
    release's, in its order: one place in our code, checked here against the wheel."""
    for field, (flag, ours) in FLAG_CHOICES.items():
        assert list(ours) == release_choices[flag], f"{field} ({flag}) differs from sglang 0.5.23's choices"
    # Every enumerated flag the engine passes is in the table.
    argv = _every_flag_argv("sglang.benchmark.one_batch") + build_server_argv(
        "python3", Workload(model_path="m", tp=2, load_format="dummy", kv_cache_dtype="fp8_e4m3",
                            attention_backend="flashinfer"))
    passed_with_choices = {a for a in argv if a in release_choices}
    # --profile-stage is the constant `decode` (test_profile_stage_accepts_decode)
    assert passed_with_choices == {"--profile-stage"} | {flag for flag, _ in FLAG_CHOICES.values()}


@pytest.mark.parametrize("field,value", [("kv_cache_dtype", "fp8"), ("attention_backend", "flashinfer_mla"),
                                         ("load_format", "safetensor")])
def test_a_value_sglang_refuses_is_refused_when_the_spec_is_parsed(release_choices, field, value):
    flag, choices = FLAG_CHOICES[field]
    assert value not in release_choices[flag]  # SGLang's argparse would refuse it at run time
    with pytest.raises(SpecError) as err:
        parse_workload({"model_path": "m", field: value}, "sglang")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"workload.{field}: {value!r} is not one of sglang 0.5.23's")
    assert ", ".join(choices) in message
    assert parse_workload({"model_path": "m", field: choices[-1]}, "sglang")  # an allowed value passes


def test_the_stand_in_takes_only_flags_and_choices_of_the_release(known_flags, release_choices):
    """tests/standins/make_fake_sglang.py's built-in server flags (what its servers declare when
    no wheel gives them the whole set) are SGLang's: names, aliases and choices of sglang 0.5.23."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent / "standins"))
    from make_fake_sglang import BUILT_IN_SERVER_FLAGS

    names = {name for flag in BUILT_IN_SERVER_FLAGS for name in flag["names"]}
    assert not names - known_flags, f"sglang 0.5.23 has no {sorted(names - known_flags)}"
    for flag in BUILT_IN_SERVER_FLAGS:
        if flag["choices"] is not None:
            assert flag["choices"] == release_choices[flag["names"][0]], flag["names"][0]


def test_read_server_flags_declares_every_server_flag_of_the_release(sglang_wheel, release, known_flags):
    """tests/sglang_wheel.py read_server_flags (what the stand-in's servers declare) has every
    server flag the collectors above find, and no other: two readings of the same sources agree;
    and its kinds follow arg_utils.py:298-417 (bool -> store_true, List -> nargs '+', Literal and
    named choices, model_path required)."""
    from tests.sglang_wheel import read_server_flags

    flags = read_server_flags(sglang_wheel)
    names = [name for flag in flags for name in flag["names"]]
    server_flags = set(collect_add_argument_flags(release[SERVER_ARGS]))
    for path, text in release.items():
        if path.startswith(FIELDS_DIR) or path == SERVER_ARGS:
            server_flags |= collect_field_flags(text)
    assert len(names) == len(set(names)) and set(names) == server_flags
    by_name = {flag["names"][0]: flag for flag in flags}
    assert by_name["--model-path"]["required"] and by_name["--model-path"]["names"] == ["--model-path", "--model"]
    assert (by_name["--tp-size"]["type"], by_name["--tp-size"]["dest"]) == ("int", "tp_size")
    assert by_name["--enable-mixed-chunk"]["action"] == "store_true"
    assert by_name["--disable-cuda-graph"]["action"] == "store_true"  # server_args.py:410 (deprecated)
    assert by_name["--max-total-tokens"]["type"] == "human_int"  # fields/schedule.py:39-50
    assert by_name["--kv-cache-dtype"]["choices"] == list(FLAG_CHOICES["kv_cache_dtype"][1])
    assert by_name["--attention-backend"]["choices"] == list(FLAG_CHOICES["attention_backend"][1])


def test_stand_in_sampling_parameters_are_the_release_contract(sglang_wheel):
    """The sampling parameters the stand-in's /generate admits are sglang 0.5.23's API contract's
    (sglang/api/v1/api_types.py:1256 _FIELDS_SamplingParams), in its order."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent / "standins"))
    from make_fake_sglang import SAMPLING_PARAMS_FIELDS

    with zipfile.ZipFile(sglang_wheel) as whl:
        source = whl.read("sglang/api/v1/api_types.py").decode()
    fields = next(ast.literal_eval(node.value) for node in ast.parse(source).body if isinstance(node, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "_FIELDS_SamplingParams" for t in node.targets))
    assert SAMPLING_PARAMS_FIELDS == fields and "max_new_tokens" in fields
