"""Docs that cannot drift: every code name, file and command the README and docs/ name in backticks exists.

A backticked span is checked when it looks like code (the checks below say how each kind is recognised):
- a path (contains '/' or ends in a source / data extension): the file or folder exists in the repository;
- `python -m specar CMD` / `python -m specar.tooling CMD`: CMD is a command of that entry point;
- `make TARGET`: a target of the Makefile;
- an identifier (snake_case with an underscore, a dotted name, CamelCase, or a call `name(...)`): the name occurs as a
  word in the repository's source (.py files, tests included, Makefile, pyproject.toml, web/*.js) or in the installed
  transformers (the upstream API an adapter follows);
- `owner/repo:path` names a file of another project and is not checked.
Prose words, parameter values and option strings are left alone (lowercase single words, flags, numbers).
docs/history/ is a journal of earlier code and is not checked.
"""
import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                              if f.endswith(".md"))
SOURCE_DIRS = ("samplers", "model_loaders", "nodes", "cli", "training", "devtools", "web", "tooling", "bench")
PATH_EXT = re.compile(r"\.(py|md|json|js|toml|txt|png|jpg|safetensors|yaml)$")
TOP_LEVEL = {d for d in os.listdir(ROOT) if not d.startswith(".")}
MODULE_FILES = {f for base, dirs, fs in os.walk(ROOT) if "/." not in base for f in fs if f.endswith(".py")}
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(\(\))?$")


def _source_text() -> str:
    parts = []
    for name in ("__init__.py", "__main__.py", "testing.py", "Makefile", "pyproject.toml"):
        p = os.path.join(ROOT, name)
        if os.path.exists(p):
            parts.append(open(p, encoding="utf-8").read())
    for d in SOURCE_DIRS + ("tests",):  # a doc may name a test
        for base, _, files in os.walk(os.path.join(ROOT, d)):
            for f in files:
                if f.endswith((".py", ".js")):
                    parts.append(open(os.path.join(base, f), encoding="utf-8").read())
    return "\n".join(parts)


_TRANSFORMERS: set = set()


def _transformers_names() -> set:
    """Every word of the installed transformers' sources: a doc may name the upstream API it adapts."""
    if not _TRANSFORMERS:
        import transformers
        for base, _, files in os.walk(os.path.dirname(transformers.__file__)):
            for f in files:
                if f.endswith(".py"):
                    _TRANSFORMERS.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", open(os.path.join(base, f),
                                                                                   encoding="utf-8").read()))
    return _TRANSFORMERS


def _spans(doc: str):
    text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks: examples, checked by running them elsewhere
    for n, line in enumerate(text.splitlines(), 1):
        for span in re.findall(r"`([^`\n]+)`", line):
            yield n, span.strip()


def _commands(entry: str) -> set:
    import importlib
    try:
        mod = importlib.import_module(entry + ".cli" if entry == "specar" else entry)
    except ImportError:
        return set()
    return set(getattr(mod, "COMMANDS", ()))


def _make_targets() -> set:
    text = open(os.path.join(ROOT, "Makefile"), encoding="utf-8").read()
    return set(re.findall(r"^([A-Za-z][A-Za-z0-9_-]*):", text, flags=re.M))


def _identifier(span: str) -> bool:
    if not IDENT.match(span) or span.lower() in {"true", "false", "none"}:
        return False
    name = span[:-2] if span.endswith("()") else span
    return ("_" in name.strip("_") or "." in name or span.endswith("()")
            or re.match(r"^[A-Z][a-z]+[A-Z]", name) is not None)


def problems(doc: str, source: str) -> list:
    found, targets = [], _make_targets()
    tooling = _commands("specar.tooling")  # `python -m specar` passes a maintainer's command on to the tooling
    commands = {"specar": _commands("specar") | tooling, "specar.tooling": tooling}
    for n, span in _spans(doc):
        where = f"{doc}:{n}: `{span}`"
        cmd = re.match(r"^python -m (specar(?:\.tooling)?) ([a-z][a-z0-9-]*)", span)
        if cmd:
            if cmd.group(2) not in commands[cmd.group(1)]:
                found.append(f"{where}: no command {cmd.group(2)!r} in python -m {cmd.group(1)}")
            continue
        mk = re.match(r"^make ([a-z][a-z0-9-]*)", span)
        if mk:
            if mk.group(1) not in targets:
                found.append(f"{where}: no Makefile target {mk.group(1)!r}")
            continue
        if " " in span or span.startswith("-"):
            continue
        top = span.split("/")[0]
        if "/" in span and top in TOP_LEVEL:  # a path in the repository (module.attribute: the module's file)
            path = span.split(":")[0].split("#")[0].rstrip("/")
            if "<" in path or "{" in path or "*" in path:
                continue
            module, _, attr = path.partition(".") if not PATH_EXT.search(path) else (path, "", "")
            if attr and os.path.exists(os.path.join(ROOT, module + ".py")):
                if not re.search(r"\b" + re.escape(attr.split(".")[-1]) + r"\b",
                                 open(os.path.join(ROOT, module + ".py"), encoding="utf-8").read()):
                    found.append(f"{where}: {attr!r} is not a name in {module}.py")
            elif not os.path.exists(os.path.join(ROOT, path)):
                found.append(f"{where}: no such file or folder")
            continue
        if re.match(r"^[a-z_][a-z0-9_]*\.py$", span):  # a module by its file name: somewhere in the product
            if span not in MODULE_FILES:
                found.append(f"{where}: no module file {span!r}")
            continue
        if "/" in span or PATH_EXT.search(span):  # a user's file (model folders, outputs): not ours to check
            continue
        if _identifier(span):
            name = span[:-2] if span.endswith("()") else span
            last = name.split(".")[-1]
            if not re.search(r"\b" + re.escape(last) + r"\b", source) and last not in _transformers_names():
                found.append(f"{where}: {last!r} is not a name in the code")
    return found


@pytest.fixture(scope="module")
def source():
    return _source_text()


@pytest.mark.parametrize("doc", DOCS)
def test_docs_name_only_what_exists(doc, source):
    found = problems(doc, source)
    assert not found, "\n".join(found)


def test_planted_stale_names_are_caught(tmp_path, source):
    """The check fails on a doc naming a removed function, a missing file, an unknown command and make target."""
    doc = tmp_path / "STALE.md"
    stale = "verify_by_" + "oracle_window"  # built here: this file is part of the scanned source
    doc.write_text(f"Use `{stale}` and `samplers/nowhere.py`, run `python -m specar no-such-command` "
                   "or `make no-such-target`; `generate()` and `samplers/engine.py` exist.\n")
    found = problems(os.path.relpath(doc, ROOT), source)
    assert len(found) == 4, found
    assert all(any(s in f for f in found) for s in (stale, "nowhere.py", "no-such-command", "no-such-target"))


def _doc_figures():
    import importlib.util
    spec = importlib.util.spec_from_file_location("doc_figures", os.path.join(ROOT, "devtools", "doc_figures.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("doc", DOCS)
def test_figures_equal_their_json(doc):
    """Every generated block (devtools/doc_figures.py) is what its committed JSON renders today."""
    stale = _doc_figures().stale_blocks(doc)
    assert not stale, "\n".join(stale) + "\nrun: python devtools/doc_figures.py"


def test_a_hand_edited_figure_is_caught(tmp_path, monkeypatch):
    figures = _doc_figures()
    run = {"meta": {"command": "python -m specar bench", "date": "2026-11-28", "wall_s": 1.0},
           "rows": [{"label": "ar", "nfe": 255.0, "step_compression": 1.0, "step_compression_total": 1.0}]}
    (tmp_path / "docs").mkdir()
    (tmp_path / "run.json").write_text(json.dumps(run))
    monkeypatch.setattr(figures, "ROOT", str(tmp_path))
    good = "<!-- figures: bench-counts run.json -->\n" + figures.render("bench-counts", "run.json") + \
        "<!-- end figures -->\n"
    (tmp_path / "GOOD.md").write_text(good)
    (tmp_path / "BAD.md").write_text(good.replace("255.0", "250.0"))
    assert figures.stale_blocks("GOOD.md") == []
    assert len(figures.stale_blocks("BAD.md")) == 1
