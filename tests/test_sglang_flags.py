"""Every flag the sglang engine can pass exists in a real SGLang release's argparse definitions.

The sources come from the sglang 0.5.23 wheel, fetched once into ~/.cache/stepwatch/ (or
$STEPWATCH_CACHE, or taken from $STEPWATCH_SGLANG_WHEEL) by the `sglang_wheel` fixture of
tests/test_patch_sglang.py: it skips only when the package index cannot be reached and fails on
any other download problem. The flags are read with `ast`, never by importing SGLang (it cannot be
installed here, FACTS.md section 4):

- `add_argument("--flag", "--alias", ...)` calls in the benchmark module and in
  `sglang/srt/server_args.py`;
- the server arguments sglang 0.5.23 derives from annotated fields
  (`sglang/srt/arg_groups/arg_utils.py:add_cli_args_from_dataclass`): a field
  `tp_size: A[int, Arg(help=..., aliases=["--tensor-parallel-size"])]` in a class under
  `sglang/srt/arg_groups/fields/` is the flag `--tp-size` (or `Arg(cli_name=...)`) plus its
  aliases, unless `Arg(no_cli=True)`; a field whose annotation carries no `Arg` or help string
  gets no flag.
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
from ingest.runs.spec import Workload

from test_patch_sglang import sglang_wheel  # noqa: F401  (the fixture: one download, one cache)

SERVER_ARGS = "sglang/srt/server_args.py"
FIELDS_DIR = "sglang/srt/arg_groups/fields/"
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


@pytest.fixture(scope="module")
def release(sglang_wheel: Path) -> dict[str, str]:  # noqa: F811
    """The wheel's Python sources that define command-line flags, by path."""
    with zipfile.ZipFile(sglang_wheel) as whl:
        names = set(whl.namelist())
        module = find_bench_module(lambda p: p.removeprefix("python/") in names)
        module_file = module.replace(".", "/") + ".py"
        server_files = (IO_STRUCT, HTTP_SERVER, SAMPLING_PARAMS, PROFILER_MANAGER)
        missing = [f for f in server_files if f not in names]
        assert not missing, f"the wheel lacks {missing}: the server path's contract moved"
        wanted = [n for n in names if n in (SERVER_ARGS, module_file, *server_files)
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

