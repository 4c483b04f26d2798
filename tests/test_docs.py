"""The docs a user reads: every link leads somewhere, every command shown parses, every results table is drawn
from the files committed beside it, and no paper is named by a number."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from p2pfed.cli import build_parser
from p2pfed.methods import METHODS
from p2pfed.report.results import write_report
from p2pfed.report.seeds import seed_folders, write_seeds_report
from tests.helpers import load_tool

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CITATIONS.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def tables_tool() -> ModuleType:
    return load_tool("docs_tables")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, as the reference's table of contents makes them (a code host's)."""
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    return {load_tool("reference").slug(m.strip(), seen) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [a or b for a, b in LINK.findall(text)]


def commands(page: Path) -> list[str]:
    """Every command of the page's shell blocks, continuation lines joined, comments and prompts left out."""
    found = []
    for lang, block in FENCE.findall(page.read_text()):
        if lang not in ("bash", "sh", "console"):  # an unlabelled block is a diagram or a file tree
            continue
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            found += [part.strip() for part in line.split("&&") if part.strip()]
    return found


def test_the_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    for heading in ("## Install and run", "## Three ways to use it", "## Methods", "## Results"):
        assert heading in text, heading
    assert "Write your own method" in text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_leads_to_a_file_and_heading_that_exist(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no such heading)")
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_shown_parses_and_names_files_that_exist(page: Path) -> None:
    parser = build_parser()
    for command in commands(page):
        argv = shlex.split(command)
        if argv[0] == "p2pfed":
            try:
                args = parser.parse_args(argv[1:])
            except SystemExit as exc:
                if exc.code == 0:  # --help
                    continue
                pytest.fail(f"{page.name}: `{command}` does not parse")
            for name in ("scenario", "recipe"):  # a shipped scenario it names must exist
                value = getattr(args, name, None)
                if isinstance(value, str) and value.startswith("scenarios/"):
                    assert (ROOT / value).exists(), (page.name, command)
        elif argv[0] in ("python", "python3", "bash") and not argv[1].startswith("-"):
            assert (ROOT / argv[1]).exists(), (page.name, command)


def test_the_command_check_sees_a_flag_that_does_not_exist(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("```bash\np2pfed run scenarios/quickstart.toml \\\n  --no-such-flag  # a comment\n```\n")
    (argv,) = commands(page)
    with pytest.raises(SystemExit):
        build_parser().parse_args(shlex.split(argv)[1:])


def test_every_results_table_is_drawn_from_its_committed_files() -> None:
    tool = tables_tool()
    stale = [str(p.relative_to(ROOT)) for p in tool.docs() if tool.draw(p.read_text(), p) != p.read_text()]
    assert not stale, f"tables that are not what their files give: {stale} (run python3 tools/docs_tables.py)"
    marked = sum(p.read_text().count("<!-- table: ") for p in tool.docs())
    assert marked >= 5  # README's quickstart, its results page, compare-digits, the benchmarks


def test_a_table_edited_by_hand_is_caught() -> None:
    tool = tables_tool()
    page = ROOT / "docs" / "results" / "quickstart.md"
    text = page.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| pfedlia-p2p "))
    edited = text.replace(row, row.replace(" |", " 1 |", 1))
    assert edited != text
    assert tool.draw(edited, page) == text  # drawn anew from summary.json, whatever the page said


def test_a_before_and_after_table_reads_after_from_the_changes_own_runs_where_it_is_given_them(
        tmp_path: Path) -> None:
    """A change's table keeps the figures it was measured with once a later change runs the method again: after
    from its own runs (after=), not from the shipped run; the baselines still from the shipped run."""
    tool = tables_tool()
    shipped = json.loads((ROOT / "scenarios" / "results" / "quickstart" / "summary.json").read_text())
    for folder, accuracy in (("before", 0.5), ("after", 0.75)):
        run = {"methods": {"pfedlia-p2p": {"accuracy": accuracy, "bottom5_accuracy": accuracy / 2}}}
        (tmp_path / folder / "quickstart").mkdir(parents=True)
        (tmp_path / folder / "quickstart" / "summary.json").write_text(json.dumps(run))
    page = ROOT / "docs" / "methods.md"
    row = tool.before_after_table(tmp_path / "before", "pfedlia-p2p", page, tmp_path / "after").splitlines()[2]
    cells = [c.strip() for c in row.split("|")[2:-1]]
    assert cells[:2] == ["50.00 (25.00)", "75.00 (37.50)"]
    assert cells[3] == tool.accuracy_cell(shipped["methods"]["local-p2p"]["accuracy"]) + " (" + tool.accuracy_cell(
        shipped["methods"]["local-p2p"]["bottom5_accuracy"]).split(" ±")[0] + ")"
    row = tool.before_after_table(tmp_path / "before", "pfedlia-p2p", page).splitlines()[2]
    assert row.split("|")[3].strip().split(" ±")[0] == tool.accuracy_cell(
        shipped["methods"]["pfedlia-p2p"]["accuracy"]).split(" ±")[0]  # without after=: the shipped run
    (tmp_path / "after" / "quickstart" / "summary.json").unlink()
    with pytest.raises(FileNotFoundError, match="no run after the change"):
        tool.before_after_table(tmp_path / "before", "pfedlia-p2p", page, tmp_path / "after")
    marker = ("<!-- table: scenarios/results/pfedlia-p2p-before-errors before=pfedlia-p2p "
              "after=scenarios/results/no-such-runs -->\n<!-- end table -->\n")
    with pytest.raises(FileNotFoundError, match=r"docs/methods\.md: a table is drawn from scenarios/results/no-such"):
        tool.draw(marker, page)
    with pytest.raises(ValueError, match=r"docs/methods\.md: .*before=pfedlia-p2p after -->' is not a table marker"):
        tool.draw("<!-- table: scenarios/results/pfedlia-p2p-before-errors before=pfedlia-p2p after -->\nold\n"
                  "<!-- end table -->\n", page)


def test_no_paper_is_named_by_a_number_where_a_user_reads() -> None:
    where = [*PAGES, *sorted((ROOT / "scenarios").glob("*.toml")), *sorted((ROOT / "p2pfed").rglob("*.py"))]
    numbered = [str(p.relative_to(ROOT)) for p in where if re.search(r"[Pp]apers? 00[0-4]", p.read_text())]
    assert not numbered, numbered


def test_every_method_runs_in_a_shipped_scenario_whose_results_are_shipped() -> None:
    shipped = {}
    for summary in (ROOT / "scenarios" / "results").glob("*/summary.json"):
        shipped.update(dict.fromkeys(json.loads(summary.read_text())["methods"], summary.parent.name))
    scenario = tomllib.loads((ROOT / "scenarios" / "compare-digits.toml").read_text())
    assert set(METHODS) <= set(scenario["scenario"]["methods"])
    assert set(METHODS) <= set(shipped), sorted(set(METHODS) - set(shipped))


def test_the_write_a_method_example_is_the_code_it_shows() -> None:
    page = (ROOT / "docs" / "methods.md").read_text()
    example = page[page.index("A complete example"):]
    (block,) = [b for lang, b in FENCE.findall(example)[:1] if lang == "python"]
    code = (ROOT / "p2pfed" / "methods" / "perfedavg.py").read_text()
    assert block.strip() in code


def test_the_readme_example_of_a_method_that_runs_both_ways_is_the_code_it_shows() -> None:
    page = (ROOT / "README.md").read_text()
    section = page[page.index("## Write your own method"):page.index("## Results")]
    blocks = [b for lang, b in FENCE.findall(section) if lang == "python"]
    code = (ROOT / "p2pfed" / "methods" / "fedprox.py").read_text()
    assert len(blocks) == 1 and blocks[0].strip() in code
    assert {"fedprox", "fedprox-p2p"} <= set(METHODS)


@pytest.mark.parametrize("name", ["quickstart", "compare-digits"])
def test_p2pfed_report_redraws_a_shipped_run_from_its_committed_files(tmp_path: Path, name: str) -> None:
    """The shipped summary.json is what `p2pfed report` computes from the shipped records, not a file kept
    from the run (a record edited, dropped or added would change it)."""
    shutil.copytree(ROOT / "scenarios" / "results" / name, tmp_path / name)
    shipped = {p.relative_to(tmp_path): json.loads(p.read_text()) for p in (tmp_path / name).rglob("summary.json")}
    for path in shipped:
        (tmp_path / path).unlink()
    seeds = seed_folders(tmp_path / name)  # a run over seeds: every seed's run, and the summary over them
    top = write_seeds_report(tmp_path / name) if seeds else write_report(tmp_path / name)  # (seeds' reports too)
    for folder in seeds.values():
        summary = folder / "summary.json"
        assert json.loads(summary.read_text()) == shipped[summary.relative_to(tmp_path)]
    assert top == shipped[Path(name) / "summary.json"] and len(shipped) == 1 + len(seeds)
