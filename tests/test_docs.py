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
import ast
import functools
import json
import os
import re

import pytest

from support import CHECKOUT

if CHECKOUT is None:
    pytest.skip("reads the checkout's docs, which an installed package lacks", allow_module_level=True)
ROOT = CHECKOUT
DOCS = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                              if f.endswith(".md"))
SOURCE_DIRS = ("samplers", "model_loaders", "nodes", "cli", "training", "web", "tooling", "bench")
PATH_EXT = re.compile(r"\.(py|md|json|js|toml|txt|png|jpg|safetensors|yaml|pt|pth|bin|ckpt)$")
TOP_LEVEL = {d for d in os.listdir(ROOT) if not d.startswith(".")}
MODULE_FILES = {f for base, dirs, fs in os.walk(ROOT) if "/." not in base for f in fs if f.endswith(".py")}
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(\(\))?$")


def _source_text() -> str:
    parts = []
    for name in ("__init__.py", "__main__.py", "Makefile", "pyproject.toml"):
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
    """The commands of `python -m specar` (the product's registry) or of `python -m specar.tooling` (read from
    tooling/__init__.py's `Commands(...)` table, not imported: the tests import no maintainer code; none in a wheel)."""
    if entry == "specar":
        from specar.cli import COMMANDS
        return set(COMMANDS)
    path = os.path.join(ROOT, "tooling", "__init__.py")
    if not os.path.exists(path):
        return set()
    tree = ast.parse(open(path, encoding="utf-8").read())
    table = next(n.args[2] for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "Commands")
    return {k.value for k in table.keys}


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
    commands = {"specar": _commands("specar"), "specar.tooling": _commands("specar.tooling")}
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
            missing = dotted_name_problem(name, source)
            if missing:
                found.append(f"{where}: {missing}")
    return found


@functools.lru_cache(maxsize=None)
def _module_text(name: str):
    """The source of the repository's module or package `name` (its last dotted part: `backends`,
    `samplers.backends`), None when the repository has none of that name."""
    parts = []
    for base, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("output", "node_modules")]
        if f"{name}.py" in files:
            parts.append(open(os.path.join(base, f"{name}.py"), encoding="utf-8").read())
        if os.path.basename(base) == name and "__init__.py" in files:
            parts.append(open(os.path.join(base, "__init__.py"), encoding="utf-8").read())
            parts.extend(f[:-3] for f in files if f.endswith(".py"))  # its modules are its names too
    return "\n".join(parts) if parts else None


def _word(word: str, text: str) -> bool:
    return re.search(r"\b" + re.escape(word) + r"\b", text) is not None


def dotted_name_problem(name: str, source: str):
    """Why a code name a doc gives does not exist, or None: every part of a dotted name is a name in the code (or
    the installed transformers'), and a part that follows one of the repository's modules is a name in that module
    (`backends.SCHEMAS`: SCHEMAS in backends.py), so a name moved to another module is caught; a variable's attribute
    (`model.image_logits`, where a module is also named `model`) passes where the code writes it so."""
    parts = name.split(".")
    for part in parts:
        if not _word(part, source) and part not in _transformers_names():
            return f"{part!r} is not a name in the code"
    for module, attr in zip(parts, parts[1:]):
        text = _module_text(module)
        if text is not None and not _word(attr, text) and not _word(f"{module}.{attr}", source):
            return f"{attr!r} is not a name in the module {module!r}"
    return None


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
    moved = "backends." + "verify_chain"  # verify_chain exists, in samplers/verification/rejection.py
    doc.write_text(doc.read_text() + f"`{moved}` and `backends.SCHEMAS`.\n")
    found = problems(os.path.relpath(doc, ROOT), source)
    assert len(found) == 5, found
    assert all(any(s in f for f in found) for s in (stale, "nowhere.py", "no-such-command", "no-such-target",
                                                      "'verify_chain' is not a name in the module 'backends'"))


PRODUCT_DIRS = ("samplers", "model_loaders", "nodes", "cli", "training", "web")


def _product_files() -> list:
    files = ["__init__.py", "__main__.py"]
    for d in PRODUCT_DIRS:
        for base, _, names in os.walk(os.path.join(ROOT, d)):
            files += sorted(os.path.relpath(os.path.join(base, f), ROOT) for f in names if f.endswith((".py", ".js")))
    return files


def code_problems(path: str, source: str) -> list:
    """What a product file's docstrings, comments and messages name that does not exist: its backticked names (the
    checks of `problems`) and every document it cites (`docs/X.md`, `README.md`) by path."""
    found = problems(path, source)
    text = open(os.path.join(ROOT, path), encoding="utf-8").read()
    for m in re.finditer(r"(?<![\w/.-])((?:[\w-]+/)*[A-Z][\w-]+\.md)\b", text):
        if not any(os.path.exists(os.path.join(ROOT, where, m.group(1))) for where in ("", "docs")):
            found.append(f"{path}: {m.group(1)} is not a document of the repository")
    return found


@pytest.mark.parametrize("path", _product_files())
def test_code_names_only_what_exists(path, source):
    found = code_problems(path, source)
    assert not found, "\n".join(found)


def test_planted_stale_names_in_code_are_caught(tmp_path, source):
    """A docstring citing a design document the repository does not have, and a moved function, are caught."""
    code = tmp_path / "planted.py"
    code.write_text('"""The contract (DESIGN' + '.md 2.1); see docs/ARCHITECTURE.md and `backends.' + 'verify_chain`."""\n')
    found = code_problems(os.path.relpath(code, ROOT), source)
    assert len(found) == 2 and "DESIGN.md" in found[1] and "verify_chain" in found[0], found


def _headings(path: str) -> list:
    text = open(path, encoding="utf-8").read()
    return [" ".join(m.group(1).split()) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).strip().replace(" ", "-")


def section_references(doc: str, root: str = ROOT) -> list:
    """The references of `doc` to a section that does not exist: a link `[..](FILE.md#anchor)` or `(#anchor)`, a
    named section `FILE.md, "Heading"` / `the README's "Heading"` (the quote is part of a heading), and `the README's
    Heading section` (a heading of README.md)."""
    path = os.path.join(root, doc)
    text = open(path, encoding="utf-8").read()
    bad = []

    def resolve(name):
        if "README" in name:
            return os.path.join(root, "README.md")
        here = os.path.normpath(os.path.join(os.path.dirname(path), name))
        return os.path.join(root, name) if os.path.exists(os.path.join(root, name)) else here

    for m in re.finditer(r"\]\(([^)\s]+?\.md)?(#[^)\s]+)?\)", text):
        target, anchor = m.group(1), m.group(2)
        if not target and not anchor:
            continue
        f = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
        if not os.path.exists(f) or (anchor and anchor[1:] not in {_slug(h) for h in _headings(f)}):
            bad.append(m.group(0))
    for m in re.finditer(r"([\w/.-]+\.md|README)(?:'s)?[,:]? \"([^\"]+)\"", text):
        f, quoted = resolve(m.group(1)), " ".join(m.group(2).split()).lower()
        if not os.path.exists(f) or not any(quoted in h.lower() for h in _headings(f)):
            bad.append(" ".join(m.group(0).split()))
    for m in re.finditer(r"README's ([A-Z][\w-]*(?:\s[\w-]+)*?) section", text):
        if " ".join(m.group(1).split()).lower() not in {h.lower() for h in _headings(os.path.join(root, "README.md"))}:
            bad.append(" ".join(m.group(0).split()))
    return bad


@pytest.mark.parametrize("doc", DOCS + ["CONTRIBUTING.md"])
def test_section_references_resolve(doc):
    if not os.path.exists(os.path.join(ROOT, doc)):
        pytest.skip(f"no {doc}")
    assert section_references(doc) == [], f"{doc} names sections that do not exist"


def test_a_reference_to_a_missing_section_is_caught(tmp_path):
    """The planted cases: NODES.md's old pointer to a README "Install" section, a dead anchor, a quoted heading."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# X\n\n## In ComfyUI\n\ntext\n")
    (tmp_path / "docs" / "A.md").write_text(
        "the README's Install section; [b](../README.md#install); README, \"Install\"; [ok](../README.md#in-comfyui); "
        "the README's In ComfyUI section\n")
    assert section_references("docs/A.md", str(tmp_path)) == [
        "](../README.md#install)", 'README, "Install"', "README's Install section"]


def test_the_readme_grid_names_the_default_backend():
    """The demo grid the README shows was drawn with the default backend's label (demo.json records the labels its
    grid.png drew; the README's demo sentence and grid come from that run): a grid left from before a default
    changed fails this (planted: grid_labels ['AR', 'scd'], as the 11-25 grid drew)."""
    from specar.samplers.backends import DEFAULT_BACKEND
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    block = re.search(r"<!-- figures: demo (\S+) -->(.*?)<!-- end figures -->\s*!\[[^\]]*\]\((\S+)\)", readme, re.S)
    assert block, "the README's demo sentence is followed by its grid"
    with open(os.path.join(ROOT, block.group(1)), encoding="utf-8") as f:
        demo = json.load(f)
    assert demo.get("grid_labels") == ["AR", DEFAULT_BACKEND], (block.group(1), demo.get("grid_labels"))
    assert block.group(3) == "docs/figures/demo_grid.png" and os.path.exists(os.path.join(ROOT, block.group(3)))


def test_readme_and_models_name_every_family_and_count_them_alike():
    """The README's first paragraph and MODELS.md's name every registered family, and MODELS.md's count is the
    registry's (planted: GLM-Image left out of MODELS.md, as it once was, fails this)."""
    from specar.model_loaders.registry import FAMILIES
    released = [f for f in FAMILIES.values() if not f.builtin]
    words = {5: "five", 6: "six", 7: "seven", 8: "eight"}
    for doc in ("README.md", "docs/MODELS.md"):
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
        intro = " ".join(text.split("\n\n")[1].split())
        for family in released:
            assert all(part in intro for part in family.label.split(" / ")), (doc, family.label)
        assert f"{words[len(released)]} families" in intro, (doc, len(released))


NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
CPU_NAMES = re.compile(r"AMD EPYC|Xeon|Ryzen|Core\(TM\)|Apple M\d")


def _prose(doc: str) -> str:
    """A doc without its generated figure blocks (those say what their JSON records)."""
    text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
    return re.sub(r"<!-- figures: .*?<!-- end figures -->", "", text, flags=re.S)


def test_the_readme_counts_the_example_workflows():
    """"N example workflows" is what example_workflows/ holds (planted: the README said two of three)."""
    count = len([f for f in os.listdir(os.path.join(ROOT, "example_workflows")) if f.endswith(".json")])
    said = re.findall(r"\b(\w+) example workflows\b", _prose("README.md"))
    assert said and all(NUMBERS.get(w) == count for w in said), (said, count)


@pytest.mark.parametrize("doc", DOCS)
def test_prose_names_only_the_machine_and_commit_its_figures_record(doc):
    """A processor named in a doc's prose is one its figures ran on (the `processor` of a JSON it renders or cites),
    and no prose claims
    a figure is of the last commit (a figure names its date; planted: README's Intel figure under "at the last
    commit" while BENCHMARKS called the machine an AMD EPYC)."""
    prose, text = _prose(doc), open(os.path.join(ROOT, doc), encoding="utf-8").read()
    assert not re.search(r"(at|of) the (last|latest|current) commit", prose, re.I), doc
    recorded = set()
    for path in set(re.findall(r"(?:/work/main/)?(docs/figures/[\w/.-]+\.json)", text)):  # rendered or cited
        if not os.path.isfile(os.path.join(ROOT, path)):
            continue  # a figure file the command writes (test_docs_name_only_what_exists checks the cited ones)
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            data = json.load(f)
        recorded.add(str(data.get("meta", data).get("processor", "")))
    for name in set(CPU_NAMES.findall(prose)):
        assert any(name in p for p in recorded), f"{doc} names {name!r}; its figures ran on {sorted(recorded)}"


def test_every_doc_a_message_cites_ships_in_the_wheel():
    """The wheel holds README.md and docs/*.md (package-data), so `docs/X.md` in a message or help names a file an
    installed package has; and the install hint's requirements file ships too (a wheel user's `pip install -r`)."""
    import fnmatch
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        patterns = tomllib.load(f)["tool"]["setuptools"]["package-data"]["specar"]
    from specar.model_loaders.families import glm_image
    cited = {"README.md", os.path.relpath(glm_image.REQUIREMENTS, ROOT)}
    assert f"pip install -r {glm_image.REQUIREMENTS}" in glm_image.MISSING_DIFFUSERS
    for path in _product_files():
        cited |= set(re.findall(r"(?<![\w/.-])(docs/[A-Z]\w*\.md)", open(os.path.join(ROOT, path)).read()))
    for rel in sorted(cited):
        assert any(fnmatch.fnmatch(rel, p) and rel.count("/") == p.count("/") for p in patterns), rel


def test_no_product_line_cites_the_history():
    """docs/history/ is a journal of earlier code: no message, help text, tooltip or comment of the product sends a
    reader there (the current docs carry what holds)."""
    found = [f"{path}:{n}" for path in _product_files()
             for n, line in enumerate(open(os.path.join(ROOT, path), encoding="utf-8"), 1) if "docs/history" in line]
    assert not found, found


def test_the_readme_fits_200_lines():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert len(f.read().splitlines()) <= 200


def test_every_figure_is_cited_and_named_without_an_issue_or_a_date():
    """Each file under docs/figures is cited by a current doc, a test or code (by its path, its name, or its folder's:
    `docs/figures/current/`, a GPU report's folder); the rest lives in docs/history/. No name holds an issue number
    or a date (`bench_issue26_*`, `*_1126b`, `*_2026-11-25`): a file says its date inside."""
    figures = os.path.join(ROOT, "docs", "figures")
    files = [os.path.relpath(os.path.join(b, f), figures) for b, _, fs in os.walk(figures) for f in fs]
    text = "\n".join(open(os.path.join(ROOT, d), encoding="utf-8").read() for d in DOCS + ["CONTRIBUTING.md"])
    text += "\n" + _source_text()
    for rel in files:
        parts = rel.split(os.sep)
        assert not re.search(r"issue\d|(?<![a-z])\d{4}[a-z]?(?![\d])|\d{4}-\d\d-\d\d", rel), rel
        names = ["docs/figures/" + "/".join(parts[:i]) + ("/" if i < len(parts) else "") for i in range(1, len(parts) + 1)]
        names.append(parts[-1])
        assert any(n in text for n in names), f"docs/figures/{rel} is cited nowhere: move it to docs/history/figures/"


def test_the_readme_snippet_offers_the_demo_model_only_what_it_takes():
    """The options the snippet's comment lists beside `load_model("demo")` (outside its parentheses, which speak of a
    model folder) each load the demo model (planted: `resolution=` listed for the demo, which has one size only)."""
    import specar
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        line = next(line for line in f if 'load_model("demo")' in line and "#" in line)
    offered = re.findall(r"(\w+)=", re.sub(r"\([^)]*\)", "", line.split("#", 1)[1]))
    examples = {"dtype": "bfloat16", "quantize": "int8", "resolution": "64x64", "device": "auto"}
    assert offered, line
    for name in offered:
        specar.load_model("demo", **{name: examples[name]})
