"""The README and docs/ say what is there: every path they name exists (and every docs path the code's comments
cite), the README lists every page of docs/, its test command is the one CI runs, every module it calls public
imports and every module of the gate is either public or named as the project's own, each page is about one
thing (at most MAX_LINES lines), and the pages speak in the present tense: no dates, work items or sessions
outside docs/records/ except a record cited by its file name. Where the pages list what the code defines (the
semantics labels, the verdicts, the exit statuses, the drawn cases' count) the lists are the code's.

Cheap: it reads text and imports the gate's modules; nothing is judged.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RECORDS = DOCS / "records"
README = ROOT / "README.md"
MAX_LINES = 300
# Paths the pages name that are another project's, not this repository's
EXTERNAL_PATHS = {"tools/autograd/derivatives.yaml"}  # torch's derivative formulas (docs/contract.md, every-op-rounded)
FIRST_SCREEN = 40

PAGES = sorted(DOCS.glob("*.md"))
USER_TEXTS = [README, *PAGES]

# A path into the repository: a top-level folder's name, then a path (globs allowed); "records/..." is docs/'s
PATH = re.compile(r"(?<![\w./-])(?:(?:docs|src|tests|tools|bench|dev|reference|golden|backend|\.ci|records)/[\w./*-]*)")
TOP_FILES = re.compile(r"(?<![\w./-])(noxfile\.py|pyproject\.toml|conftest\.py|MANIFEST\.in)\b")
RECORD_NAME = re.compile(r"\b20\d\d-\d\d-\d\d-[\w.-]*\w")
# Diary words: which day, which work item, which attempt (a record cited by its file name is allowed)
DIARY = [
    re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    # this project's work items ("in issue N", "(issue N)"); another project's issue is cited by its name first
    re.compile(
        r"(?:^|[(,;:]\s*|\b(?:in|the|this|of|for|see|from|per|by|after|before|since)\s+)issues? \d+", re.I | re.M
    ),
    re.compile(r"\bwork items?\b", re.I),
    re.compile(r"\bitems? \d+", re.I),
    re.compile(r"\bstep \d+", re.I),
    re.compile(r"\battempt", re.I),
    re.compile(r"\b(?:this|that|next|previous|earlier|later|last|\w+(?:st|nd|rd|th)) session\b", re.I),
    re.compile(r"\bUTC\b"),
    re.compile(r"\b(?:today|yesterday)\b", re.I),
]


def named_paths(text: str) -> set[str]:
    found = set()
    for match in PATH.findall(text):
        path = match.rstrip(".,;:)`'\"")
        if path.startswith("records/"):
            path = "docs/" + path
        found.add(path)
    found |= set(TOP_FILES.findall(text))
    found |= {"docs/records/" + name for name in RECORD_NAME.findall(text) if "." in name}
    return found


def logs() -> set[str]:
    """The logs a tool appends to (records/README.md, "Logs"): undated names, created by their first entry."""
    section = (RECORDS / "README.md").read_text().split("## Logs", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^- ([\w.-]+\.md):", section, re.M))


def exists(path: str) -> bool:
    if "*" in path:
        return any(ROOT.glob(path))
    return (ROOT / path).exists() or path in {f"docs/records/{log}" for log in logs()}


@pytest.mark.parametrize("text", USER_TEXTS, ids=lambda p: p.name)
def test_every_path_a_page_names_exists(text):
    names = named_paths(text.read_text())
    missing = sorted(p for p in names - EXTERNAL_PATHS if not exists(p))
    assert not missing, f"{text.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_every_docs_path_the_code_cites_exists():
    cited = {}
    for folder in ("src", "reference", "dev", "tests", "tools", "bench"):
        for source in (ROOT / folder).rglob("*.py"):
            if source == Path(__file__).resolve():  # this file names missing paths on purpose
                continue
            for path in re.findall(r"docs/[\w./*-]+\.(?:md|png|csv|json)", source.read_text()):
                cited.setdefault(path, source.relative_to(ROOT))
    for source in (ROOT / "noxfile.py", ROOT / "conftest.py", ROOT / "pyproject.toml", ROOT / "tools" / "gpu_run.sh"):
        for path in re.findall(r"docs/[\w./*-]+\.(?:md|png|csv|json)", source.read_text()):
            cited.setdefault(path, source.relative_to(ROOT))
    cited = {path: where for path, where in cited.items() if not path.startswith("docs/out/")}  # test data
    missing = {path: str(where) for path, where in cited.items() if not exists(path)}
    assert not missing, f"comments cite docs that do not exist: {missing}"


def test_the_readme_lists_every_page_of_docs():
    listed = set(re.findall(r"\]\(docs/([\w.-]+\.md)\)", README.read_text()))
    assert listed == {p.name for p in PAGES}, (sorted(listed), [p.name for p in PAGES])


def test_the_readme_test_command_is_what_ci_runs_on_its_first_screen():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    command = ci[-1].strip()
    first = README.read_text().splitlines()[:FIRST_SCREEN]
    assert command in (line.strip() for line in first), (command, "not a line of the README's first screen")
    screen = "\n".join(first)
    assert "python -m dsrope_gate.conformance --op" in screen and "docs/judging.md" in screen


def public_api() -> dict[str, list[str]]:
    """The README's public API section: package -> the names (module or module.attribute) it lists."""
    section = README.read_text().split("## The public API", 1)[1].split("\n## ", 1)[0]
    listed = {}
    for package, rest in re.findall(r"^- `(\w+)`: (.*(?:\n  .*)*)", section, re.M):
        listed[package] = [n for n in re.findall(r"`([\w.]+)`", rest)]
    return listed, section


def resolve(package: str, dotted: str):
    obj = importlib.import_module(package)
    path = package
    for part in dotted.split("."):
        path += "." + part
        obj = getattr(obj, part) if hasattr(obj, part) else importlib.import_module(path)
    return obj


def test_every_module_the_readme_calls_public_imports():
    listed, _ = public_api()
    assert set(listed) == {"dsrope", "dsrope_reference", "dsrope_gate"}, listed
    for package, names in listed.items():
        for name in names:
            assert resolve(package, name) is not None, f"{package}.{name}"


def test_every_gate_module_is_public_or_named_as_the_projects_own():
    listed, section = public_api()
    own = set(re.findall(r"`(\w+)`", section.split("The gate's other modules", 1)[1].split(")", 1)[0]))
    modules = {p.stem for p in (ROOT / "src" / "dsrope_gate").glob("*.py") if p.stem != "__init__"}
    modules |= {p.parent.name for p in (ROOT / "src" / "dsrope_gate").glob("*/__init__.py")}
    assert modules == set(listed["dsrope_gate"]) | own, (sorted(modules), sorted(set(listed["dsrope_gate"]) | own))
    assert not set(listed["dsrope_gate"]) & own


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_page_is_at_most_max_lines(page):
    lines = len(page.read_text().splitlines())
    assert lines <= MAX_LINES, f"{page.name}: {lines} lines; split it (one thing a page) or move history to records/"


@pytest.mark.parametrize("text", USER_TEXTS, ids=lambda p: p.name)
def test_no_diary_words_outside_the_records(text):
    body = RECORD_NAME.sub("RECORD", text.read_text())
    found = [(m.group(0), body[: m.start()].count("\n") + 1) for word in DIARY for m in word.finditer(body)]
    assert not found, f"{text.relative_to(ROOT)}: diary words (word, line): {found}"


def test_the_diary_check_rejects_a_date_and_a_session_and_passes_a_record_name():
    def diary(text):
        body = RECORD_NAME.sub("RECORD", text)
        return [m.group(0) for word in DIARY for m in word.finditer(body)]

    assert diary("measured on 2026-12-06 in the eighth session") == ["2026-12-06", "eighth session"]
    assert diary("the nox sessions; the lint session") == []
    assert diary("see docs/records/2026-12-06-mutants.md") == []
    assert [w.strip(" (") for w in diary("(issue 50), in issue 36, step 2")] == ["issue 50", "in issue 36", "step 2"]
    assert diary("vLLM issue 27722; jquesnelle/yarn issue 65") == []


def test_every_record_is_dated():
    names = [p.name for p in RECORDS.iterdir() if p.name != "README.md" and p.name not in logs()]
    undated = [name for name in names if not re.match(r"20\d\d-\d\d-\d\d-", name)]
    assert not undated, undated


def test_the_pages_lists_are_the_codes():
    from dsrope_gate.cli import EXIT_STATUS
    from dsrope_gate.conformance import EXAMPLES
    from dsrope_gate.conformance.judging import VERDICTS
    from dsrope_gate.semantics import LABELS

    judging = (DOCS / "judging.md").read_text()
    labels = judging.split("## Semantics labels", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^\| `([\w-]+)` \|", labels, re.M) == list(LABELS)
    verdicts = judging.split("## Verdicts", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^\| ([a-z ]+) \|", verdicts, re.M)[1:] == list(VERDICTS)  # [0]: the header
    statuses = judging.split("## Exit status", 1)[1].split("\n## ", 1)[0]
    assert [int(s) for s in re.findall(r"^\| (\d) \|", statuses, re.M)] == list(EXIT_STATUS)
    for text in USER_TEXTS:
        drawn = re.findall(r"(\d+) (?:hypothesis-drawn cases|cases drawn by hypothesis)", text.read_text())
        assert all(int(n) == EXAMPLES for n in drawn), (text.name, drawn, EXAMPLES)


def test_the_compile_lists_count_is_the_lists():
    import gzip

    doc = (ROOT / "dev" / "dsrope_dev" / "compile_cache.py").read_text()
    stated = int(re.search(r"([\d,]+) specializations are", doc)[1].replace(",", ""))
    lines = gzip.open(ROOT / "tests" / "triton_specializations.jsonl.gz", "rt").read().splitlines()
    assert stated == len(lines) - 1  # the first line says which triton recorded the list


def test_the_path_check_finds_a_path_that_is_gone_and_resolves_record_names():
    found = named_paths("see docs/perf.md, `tools/decode_ceiling.py` and 2026-12-04-parity-cpu.png.")
    assert found == {"docs/perf.md", "tools/decode_ceiling.py", "docs/records/2026-12-04-parity-cpu.png"}
    assert [exists(p) for p in sorted(found)] == [False, True, False]
    assert exists("docs/records/*-tuning.md") and not exists("docs/records/*-no-such.md")
