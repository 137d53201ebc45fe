"""The process's environment defaults (``transformer_mt.environment``, exported by ``runtime``): set when ``tmt`` or
``load()`` starts, never by importing the package or building a model, and a value the user set is kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from transformer_mt import runtime
from transformer_mt.environment import ONEDNN_CACHE_VARIABLES

_ENV = {k: v for k, v in os.environ.items() if k not in ONEDNN_CACHE_VARIABLES}


def _python(code: str, **env: str) -> dict:
    """Run ``code`` in a fresh interpreter without the oneDNN variables (plus ``env``); it prints one JSON line."""
    done = subprocess.run(
        [sys.executable, "-c", code], env={**_ENV, **env}, capture_output=True, text=True, check=True, timeout=300
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_defaults_bound_onednns_caches_and_keep_what_the_user_set(monkeypatch):
    for name in ONEDNN_CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "7")
    runtime.set_environment_defaults()
    assert os.environ["LRU_CACHE_CAPACITY"] == str(runtime.ONEDNN_CACHE_ENTRIES) == "64"
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "7"


@pytest.mark.slow
def test_importing_and_building_models_leaves_the_environment_alone():
    code = (
        "import os, json\nbefore = dict(os.environ)\n"
        "import torch, transformer_mt.model, transformer_mt.model.ops.cpu, transformer_mt.decoding\n"
        "from transformer_mt.config import ModelConfig\n"
        "for name in ('auto', 'reference'):\n"
        "    m = transformer_mt.model.Transformer(ModelConfig(d_model=16, heads=2, d_ff=32, encoder_layers=1, "
        "decoder_layers=1), src_vocab_size=20, tgt_vocab_size=20, ops=transformer_mt.model.choose_ops(name))\n"
        "    with torch.no_grad():\n"
        "        m(torch.tensor([[5, 6, 3]]), torch.tensor([[2, 5, 6]]))\n"
        "print(json.dumps(dict(os.environ) == before))"
    )
    assert _python(code) is True


@pytest.mark.slow
def test_tmt_sets_the_defaults_before_any_command_and_help_imports_no_torch():
    code = (
        "import json, os, sys\nfrom transformer_mt.cli import main\ntry:\n    main(['--help'])\n"
        "except SystemExit:\n    pass\n"
        "print(json.dumps([os.environ.get('LRU_CACHE_CAPACITY'), os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY'), "
        "'torch' in sys.modules]))"
    )
    assert _python(code) == ["64", "64", False]
    assert _python(code, LRU_CACHE_CAPACITY="1024") == ["1024", "64", False]  # the user's value kept


@pytest.mark.slow
def test_load_sets_the_defaults(tiny_checkpoint):
    code = (
        "import json, os, transformer_mt\n"
        f"transformer_mt.load({str(tiny_checkpoint)!r}, device='cpu')\n"
        "print(json.dumps(os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY')))"
    )
    assert _python(code) == "64"
