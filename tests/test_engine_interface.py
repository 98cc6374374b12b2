"""The engine interface (ingest/runs/engines/base.py): every engine is found by its spec name, and
each engine's check refuses, before anything runs, what would fail at run time. Real specs parsed
by the real parser; the checks run on this machine (no GPU here, so device cuda must be refused)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ingest.runs.connect import make_host_for
from ingest.runs.engines.base import Checkout, EngineIO
from ingest.runs.engines.registry import ENGINES
from ingest.runs.errors import SpecError
from ingest.runs.names import ENGINES as ENGINE_NAMES
from ingest.runs.spec import Config, HostConfig, RepoConfig, parse_spec

CONFIG = Config(hosts={"local": HostConfig("local", python=sys.executable)},
                repos={"sg": RepoConfig("sg", "/nonexistent/sglang")})
LOCAL = make_host_for(CONFIG, "local")


def test_every_engine_name_has_an_engine_and_no_other():
    assert tuple(ENGINES) == ENGINE_NAMES
    assert all(engine.name == name for name, engine in ENGINES.items())


def test_the_import_engine_returns_the_path_and_refuses_one_gone_since_it_was_queued(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text("{}")
    config = Config(hosts=CONFIG.hosts, import_roots=(os.path.realpath(tmp_path),))  # [imports] roots
    spec = parse_spec({"engine": "import", "path": str(trace)}, config)  # parsing checks it exists now
    ENGINES["import"].check(spec, config, LOCAL)
    assert ENGINES["import"].run(spec, config, LOCAL, Checkout(), tmp_path, EngineIO()) == trace
    trace.unlink()
    with pytest.raises(SpecError, match=r"^spec.path: .*t.json does not exist on this machine$"):
        ENGINES["import"].check(spec, config, LOCAL)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU: nothing to refuse")
@pytest.mark.slow
def test_the_reference_engine_refuses_cuda_on_a_host_without_a_gpu():
    spec = parse_spec({"engine": "reference", "device": "cuda", "workload": {"preset": "tiny"}}, CONFIG)
    with pytest.raises(SpecError, match="host local has no CUDA device"):
        ENGINES["reference"].check(spec, CONFIG, LOCAL)
    ENGINES["reference"].check(parse_spec({"engine": "reference", "workload": {"preset": "tiny"}}, CONFIG),
                               CONFIG, LOCAL)  # cpu: nothing to ask


def test_the_sglang_engine_refuses_a_patch_file_gone_since_the_spec_was_queued(tmp_path):
    patch = tmp_path / "gather.patch"
    patch.write_text("--- a/x\n+++ b/x\n")
    config = Config(hosts=CONFIG.hosts, repos=CONFIG.repos, patches={"gather": (str(patch),)})
    body = {"engine": "sglang", "repo": "sg", "ref": "HEAD", "workload": {"model_path": "/m"}}
    spec = parse_spec({**body, "variant": "gather"}, config)
    assert Path(ENGINES["sglang"].check(spec, config, LOCAL)) == Path("/nonexistent/sglang")  # the repo path
    patch.unlink()
    with pytest.raises(SpecError, match=r"spec.variant 'gather': patch file .*gather.patch does not exist"):
        ENGINES["sglang"].check(spec, config, LOCAL)
    tp2 = parse_spec({**body, "variant": "unpatched", "workload": {"model_path": "/m", "tp": 2, "output_len": 4}},
                     config)
    with pytest.raises(SpecError):  # the server path needs room for its decode capture
        ENGINES["sglang"].check(tp2, config, LOCAL)
