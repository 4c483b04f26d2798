"""docs/configuration.md and docs/cli.md are written by tools/reference.py from the option dataclasses and the
argument parser: the committed pages must be what it writes now, miss no key, option or subcommand, and every
key should say what it is (the fields without a comment may only become fewer)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tomli_w

from p2pfed.cli import build_parser
from p2pfed.config import MeshConfig, NodeConfig, load_node_config
from p2pfed.learn.partition import PARTITIONS
from p2pfed.methods import METHODS, OPTIONS
from p2pfed.methods.options import options_of
from p2pfed.scenario.config import Adversary, DataConfig, Event, RayConfig, Scenario, TrainConfig, load_scenario
from tests.helpers import load_tool

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = "run `python3 tools/reference.py` and commit the pages it writes"


reference = load_tool("reference")

# Fields that have no comment in the code (Class.field, where the field is declared): their rows show an empty
# description. Give one a comment (above it, or a trailing `# ...`) and take it off this list; never add to it.
UNDOCUMENTED = {
    "CentralOptions.optics_min_samples",
    "CentralOptions.optics_xi",
    "ClusterDirichlet.alpha_between",
    "ClusterDirichlet.alpha_within",
    "ClusterLabelDirichlet.alpha",
    "ClusterLabelDirichlet.draw",
    "ClusterNClass.k_client",
    "ClusterNClass.k_cluster",
    "Clustered.clusters",
    "Dirichlet.alpha",
    "Dominant.classes",
    "Dominant.share",
    "FeSEMCAMOptions.warmup",
    "Feature.alpha",
    "Feature.clusters",
    "Feature.transforms",
    "IFCACAMOptions.warmup",
    "InfluenceOptions.lia_lr",
    "Missing.classes",
    "NClass.classes",
    "NodeConfig.advertise",
    "NodeConfig.bind",
    "NodeConfig.discovery",
    "NodeConfig.join",
    "NodeConfig.join_key",
    "NodeConfig.keys",
    "NodeConfig.name",
    "NodeConfig.state_dir",
    "Noisy.extra_labels",
    "Noisy.extra_prob",
    "Pathological.label_groups",
}

# what each heading of configuration.md documents, listed here apart from the generator
TABLES: dict[str, type] = {
    "[scenario]": Scenario, "[data]": DataConfig, "[train]": TrainConfig, "[mesh]": MeshConfig, "[ray]": RayConfig,
    "[[events]]": Event, "[[adversaries]]": Adversary,
    "[node] or [bootstrap]": NodeConfig, "[node.mesh] or [bootstrap.mesh]": MeshConfig,
    **{f'[data.partition] kind = "{kind}"': cls for kind, cls in PARTITIONS.items()},
    **{f"[methods.{name}]": cls for name, cls in OPTIONS.items() if cls is not None},
}
# fields that are a table of their own (load_scenario, load_node_config), not a key of their class's table
OWN_TABLES = {
    ("Scenario", "data"): "[data]", ("Scenario", "train"): "[train]", ("Scenario", "mesh"): "[mesh]",
    ("Scenario", "ray"): "[ray]",
    ("Scenario", "events"): "[[events]]", ("Scenario", "adversaries"): "[[adversaries]]",
    ("Scenario", "method_tables"): "[methods.NAME]", ("DataConfig", "partition"): "[data.partition]",
    ("NodeConfig", "mesh"): "[node.mesh] or [bootstrap.mesh]",
}
NOT_KEYS = {("Scenario", "path")}  # set by the loader: named in the text of [scenario]


@pytest.fixture(scope="module")
def configuration() -> str:
    return str(reference.configuration_markdown())


@pytest.fixture(scope="module")
def cli() -> str:
    return str(reference.cli_markdown())


def sections(page: str) -> dict[str, str]:
    """A page's headings (without the #s) -> the text under each, up to the next heading."""
    parts = re.split(r"^#+ (.+)$", page, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def keys_in(text: str) -> set[str]:
    """The keys of the Markdown table in a section."""
    return set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE))


def test_the_configuration_page_is_what_the_code_says(configuration: str) -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == configuration, (
        f"docs/configuration.md is stale (an option, a default or a comment changed): {REGENERATE}")


def test_the_cli_page_is_what_the_parser_says(cli: str) -> None:
    committed = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    if reference.CLI_HEADER not in committed:  # argparse words its help differently from one Python to the next
        pytest.skip("docs/cli.md was written with another Python's argparse; the option check below still runs")
    assert committed == cli, f"docs/cli.md is stale (a subcommand, an option or its help changed): {REGENERATE}"


def test_every_key_of_every_table_is_on_the_page(configuration: str) -> None:
    found = sections(configuration)
    missing = []
    for heading, cls in TABLES.items():
        keys = keys_in(found.get(heading, ""))
        for f in dataclasses.fields(cls):
            where = (cls.__name__, f.name)
            if where in OWN_TABLES:
                ok = OWN_TABLES[where] in found
            elif where in NOT_KEYS:
                ok = f"`{f.name}`" in found.get(heading, "")
            else:
                ok = f.name in keys
            if not ok:
                missing.append(f"{heading} {f.name}")
    assert missing == [], f"configuration.md misses: {', '.join(missing)}"
    assert keys_in(found["[data.partition]"]) == {"kind"}
    no_options = found["[methods.NAME]"]
    assert all(f"`{name}`" in no_options for name in METHODS if OPTIONS[name] is None)


def documented_defaults(text: str) -> dict[str, object]:
    """A section's keys at the defaults its table shows, read as TOML values."""
    rows = re.findall(r"^\| `([^`]+)` \| [^|]+ \| `(.+?)` \| ", text, flags=re.MULTILINE)
    return {key: tomllib.loads("v = " + value.replace("\\|", "|"))["v"] for key, value in rows}


def test_a_file_with_every_key_at_its_documented_default_loads_as_the_defaults(tmp_path: Path,
                                                                              configuration: str) -> None:
    """What the page says is accepted is: each table written out from the page loads, and gives the defaults."""
    found = sections(configuration)
    tables = {name: documented_defaults(found[f"[{name}]"]) for name in ("scenario", "data", "train", "mesh", "ray")}
    lists = {name: [documented_defaults(found[f"[[{name}]]"])] for name in ("events", "adversaries")}
    for kind, cls in PARTITIONS.items():
        partition = {"kind": kind, **documented_defaults(found[f'[data.partition] kind = "{kind}"'])}
        path = tmp_path / f"{kind}.toml"
        path.write_text(tomli_w.dumps({**tables, "data": {**tables["data"], "partition": partition}, **lists}))
        scenario = load_scenario(path)
        assert (scenario.data, scenario.train, scenario.mesh) == (DataConfig(partition=cls()), TrainConfig(),
                                                                  MeshConfig())
        assert (scenario.events, scenario.adversaries) == ([Event()], [Adversary()])
        assert scenario.ray == RayConfig()
    for name, options in OPTIONS.items():
        if options is not None:
            scenario.method_tables = {name: documented_defaults(found[f"[methods.{name}]"])}
            assert options_of(options, scenario, name, fit=False) == options()
    node = tmp_path / "node.toml"
    node.write_text(tomli_w.dumps({"node": {**documented_defaults(found["[node] or [bootstrap]"]),
                                            "mesh": documented_defaults(found["[node.mesh] or [bootstrap.mesh]"])}}))
    assert load_node_config(node, "node") == NodeConfig()


def test_the_contents_link_every_heading(configuration: str) -> None:
    links = re.findall(r"^\s*- \[.*\]\(#([^)]+)\)$", configuration, flags=re.MULTILINE)
    assert len(links) == len(set(links)) == len(sections(configuration)) - 1  # all but the page's title
    assert "datapartition-kind--noisy" in links and "methodspfedlia-p2p" in links


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += _parsers(sub)
    return found


def test_every_subcommand_and_option_is_on_the_cli_page(cli: str) -> None:
    found = sections(cli)
    missing = []
    for parser in _parsers(build_parser()):
        text = found.get(parser.prog)
        if text is None:
            missing.append(parser.prog)
            continue
        missing += [f"{parser.prog} {option}" for action in parser._actions if action.help != argparse.SUPPRESS
                    for option in action.option_strings if not re.search(rf"(?<![\w-]){option}(?![\w-])", text)]
    assert missing == [], f"cli.md misses: {', '.join(missing)}"
    assert {"p2pfed mesh status", "p2pfed keys generate"} <= set(found)


def test_the_cli_page_does_not_depend_on_the_terminal(monkeypatch: pytest.MonkeyPatch, cli: str) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert reference.cli_markdown() == cli


def test_no_more_keys_lack_a_description() -> None:
    lacking = {key.owner for table in reference.all_tables() for key in table.keys if not key.description}
    new = sorted(lacking - UNDOCUMENTED)
    assert new == [], (f"{', '.join(new)}: say what each is in a comment on the field (the line above it, or a "
                       f"trailing # ...): the comment is its description in docs/configuration.md")
    described = sorted(UNDOCUMENTED - lacking)
    assert described == [], f"{', '.join(described)} now have a description: take them off UNDOCUMENTED"


# ---- the comment reader, on a table made for it ----


@dataclass
class _Base:
    """A table of a base class.

    Its second paragraph."""

    # above, one line
    above: int = 1
    trailing: str = "x"  # trailing
    # above, first line
    # above, second line
    both: float = 0.5  # and trailing
    spread: list[int] = field(default_factory=list)  # trailing, first line
                                                     # trailing, continued
    bare: bool = False
    # a comment with a blank line before the field is no field's

    apart: tuple[str, ...] = ()
    inner: dict[str, int] = field(
        default_factory=dict,  # inside the field's own lines
    )


@dataclass
class _Variant(_Base):
    trailing: str = "y"
    bare: bool = True  # the variant's own


def test_the_comment_reader_takes_the_lines_above_and_the_trailing_comment() -> None:
    assert reference.declared_comments(_Base) == {
        "above": "above, one line", "trailing": "trailing", "both": "above, first line above, second line and trailing",
        "spread": "trailing, first line trailing, continued", "bare": "", "apart": "",
        "inner": "inside the field's own lines"}


def test_a_redeclared_field_keeps_its_comment_and_a_variant_names_where_it_looked() -> None:
    comments = reference.field_comments(_Variant)
    assert comments["trailing"] == ("trailing", "_Base.trailing")  # a new default, the same key
    assert comments["bare"] == ("the variant's own", "_Variant.bare")
    assert comments["apart"] == ("", "_Base.apart")
    assert reference.class_doc(_Base) == "A table of a base class.\n\nIts second paragraph."
    assert reference.class_doc(_Variant) == ""  # not the base's, nor the signature @dataclass writes


def test_a_table_shows_types_and_defaults_as_toml() -> None:
    keys = {key.name: key for key in reference.keys_of(_Base)}
    assert [(k.type, k.default) for k in keys.values()] == [
        ("integer", "1"), ("string", '"x"'), ("float", "0.5"), ("array of integers", "[]"), ("boolean", "false"),
        ("array of strings", "[]"), ("table", "{}")]
    assert reference.toml_value(["a", True, 1e-05]) == '["a", true, 1e-05]'
    page = reference.table_markdown(reference.Table("[x]", 3, "", (reference.Key("k", "string", '"a|b"', "x | y",
                                                                                 "X.k"),)))
    assert page.splitlines()[-1] == '| `k` | string | `"a\\|b"` | x \\| y |'


def test_check_names_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "docs").mkdir()
    monkeypatch.setattr(reference, "ROOT", tmp_path)
    monkeypatch.setattr(reference, "CONFIGURATION", tmp_path / "docs" / "configuration.md")
    monkeypatch.setattr(reference, "CLI", tmp_path / "docs" / "cli.md")
    assert reference.main(["--check"]) == 1
    assert "docs/configuration.md is stale" in capsys.readouterr().err
    assert reference.main([]) == 0 and reference.main(["--check"]) == 0
    (tmp_path / "docs" / "cli.md").write_text("edited by hand\n")
    assert reference.main(["--check"]) == 1
    assert capsys.readouterr().err.strip() == "docs/cli.md is stale: run python3 tools/reference.py"
