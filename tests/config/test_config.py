from datetime import timedelta

import pytest

from ingest.config import load_config
from ingest.errors import ConfigError
from ingest.secrets import read_secrets_file


def write(tmp_path, text):
    path = tmp_path / "ingest.yaml"
    path.write_text(text)
    return path


def test_demo_config_is_valid_and_documents_every_table():
    config = load_config("configs/demo.yaml")
    assert [t.name for t in config.tables] == ["customers", "products", "orders"]
    assert config.table("orders").primary_key == ("id",)
    assert config.table("customers").tombstone_retention == timedelta(days=7)


def test_relative_paths_resolve_against_the_file(tmp_path):
    config = load_config(write(tmp_path, "workdir: work\ntables: [{name: a, topic: t.a}]\n"))
    assert config.table_path("a").local == (tmp_path / "work" / "tables" / "a").resolve()
    assert config.log_dir == (tmp_path / "work" / "topics").resolve()


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ("tables: [{name: a, topic: t, delete_mode: never}]", "tables[0].delete_mode", "'hard' or 'soft'"),
        ("tables: [{name: '../x', topic: t}]", "tables[0].name", "letters, digits"),
        ("tables: [{name: _cdc_x, topic: t}]", "tables[0].name", "_cdc_"),
        ("tables: [{name: a, topic: t, colour: red}]", "tables[0].colour", "Extra inputs"),
        ("tables: []", "(top level)", "no tables: list them under 'tables' or find them with 'discover"),
        ("source: {kind: kafka}\ntables: [{name: a, topic: t}]", "source", "bootstrap_servers"),
        ("tables: [{name: a, topic: t}, {name: b, topic: t}]", "(top level)", "same topic"),
        ("target: {quarantine_table: a}\ntables: [{name: a, topic: t}]", "(top level)",
         "a table is named 'a', the name of target.quarantine_table"),
        ("source: {kind: kafka, kafka: {bootstrap_servers: ''}}\ntables: [{name: a, topic: t}]",
         "source.kafka.bootstrap_servers", "expected host:port"),
        ("tables: [{name: a, topic: t, primary_key: []}]", "tables[0].primary_key", "name at least one column"),
        ("tables: [{name: a, topic: t, primary_key: 'id, tenant'}]", "tables[0].primary_key",
         "give the columns as a list, [id, tenant], not as one string"),
        ("target: {root: ''}\ntables: [{name: a, topic: t}]", "target.root", "is empty"),
        ("source: {registry: {kind: confluent, url: 'registry:8081'}}\ntables: [{name: a, topic: t}]",
         "source.registry.url", "expected an http:// or https:// URL"),
        ("source: {max_records_per_batch: 0}\ntables: [{name: a, topic: t}]", "source.max_records_per_batch",
         "greater than 0"),
        ("target: {driver_lookup_rows: -1}\ntables: [{name: a, topic: t}]", "target.driver_lookup_rows",
         "greater than or equal to 0"),
        ("target: {plan_on: cluster}\ntables: [{name: a, topic: t}]", "target.plan_on", "'driver' or 'executors'"),
        ("source: {kind: kafka, kafka: {bootstrap_servers: 'b:9092', reader: spark}, max_records_per_table: 10}\n"
         "tables: [{name: a, topic: t}]", "source", "max_records_per_table needs the engine's own reader"),
    ],
)
def test_errors_name_the_file_and_the_field(tmp_path, text, field, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: {field}")
    assert message in str(info.value)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="a directory, not a configuration file"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "tables: [unclosed"))


def test_a_one_column_key_may_be_written_as_its_name(tmp_path):
    """`primary_key: id` was refused with pydantic's "Input should be a valid tuple"."""
    config = load_config(write(tmp_path, "tables: [{name: a, topic: t, primary_key: id}]"))
    assert config.table("a").primary_key == ("id",)


@pytest.mark.parametrize(("text", "message"), [
    ("tables: [{name: a, topic: t}\nworkdir: w\n", "not valid YAML: line 2, column 1: expected ',' or ']'"),
    ("tables: [{name: a, topic: t}]\nworkdir: w\ntables: [{name: b, topic: u}]\n",
     "not valid YAML: line 3, column 1: the key 'tables' is given twice"),
    ("tables: [{name: a, topic: t, name: b}]\n", "line 1, column 30: the key 'name' is given twice"),
])
def test_a_yaml_mistake_is_one_line_with_where_it_is(tmp_path, text, message):
    """PyYAML keeps the last of two equal keys without a word: a second `tables:` replaced the first."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert "\n" not in str(info.value) and message in str(info.value), str(info.value)


@pytest.mark.parametrize(("text", "message"), [
    ('TOKEN: "first"\nOTHER: "x"\nTOKEN: "second"\n',
     "not valid YAML (line 3, column 1: the key 'TOKEN' is given twice)"),
    ('TOKEN: "s3cr3t-value\nOTHER: x\n', "not valid YAML (line 3, column 1)"),
])
def test_a_secrets_file_mistake_says_where_and_never_quotes_a_value(tmp_path, text, message):
    """A name given twice in the secrets file used whichever came last, without a word."""
    path = tmp_path / "secrets.yaml"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(ConfigError) as info:
        read_secrets_file(path)
    said = str(info.value)
    assert said == f"secrets file {path}: {message}" and "first" not in said and "s3cr3t" not in said


def test_a_merge_key_may_be_overridden(tmp_path):
    text = "tables: [&a {name: a, topic: t, delete_mode: soft}, {<<: *a, name: b, topic: u}]\n"
    config = load_config(write(tmp_path, text))
    assert [(t.name, t.topic, t.delete_mode) for t in config.tables] == [("a", "t", "soft"), ("b", "u", "soft")]


def test_column_selection_takes_exactly_one_list(tmp_path):
    import pydantic

    from ingest.config import ColumnSelection

    assert ColumnSelection(include=("a",)).keeps("a") and not ColumnSelection(include=("a",)).keeps("b")
    assert ColumnSelection(exclude=("b",)).keeps("a") and not ColumnSelection(exclude=("b",)).keeps("b")
    assert ColumnSelection(exclude=("id",)).keeps("id", ["id"])
    for bad in ({}, {"include": ["a"], "exclude": ["b"]}):
        with pytest.raises(pydantic.ValidationError, match="exactly one of include or exclude"):
            ColumnSelection(**bad)


def test_a_configuration_extends_another_and_states_only_what_differs(tmp_path):
    (tmp_path / "base.yaml").write_text("workdir: base\nsource: {max_records_per_batch: 7, queries: 2}\n"
                                        "tables: [{name: a, topic: t.a}]\n")
    (tmp_path / "variant.yaml").write_text("extends: base.yaml\nsource: {queries: 3}\n"
                                           "target: {root: 's3://lake/x'}\n")
    config = load_config(tmp_path / "variant.yaml")
    assert (config.source.max_records_per_batch, config.source.queries) == (7, 3)  # merged key by key
    assert config.workdir == (tmp_path / "base").resolve() and [t.name for t in config.tables] == ["a"]
    assert config.tables_root.uri == "s3://lake/x"
    (tmp_path / "base.yaml").write_text("extends: variant.yaml\n")
    with pytest.raises(ConfigError, match="a cycle"):
        load_config(tmp_path / "variant.yaml")
    (tmp_path / "typo.yaml").write_text("extends: bsae.yaml\n")  # it said "bsae.yaml: configuration file not found"
    said = f"^{tmp_path / 'typo.yaml'}: extends: {tmp_path / 'bsae.yaml'} is not a file$"
    with pytest.raises(ConfigError, match=said):
        load_config(tmp_path / "typo.yaml")


def test_the_s3_demo_configuration_is_the_demo_on_the_stacks_minio():
    demo, s3 = load_config("configs/demo.yaml"), load_config("configs/demo-s3.yaml")
    assert s3.tables == demo.tables and s3.quality == demo.quality
    assert s3.tables_root.uri == "s3://lake/demo" and s3.target.storage.endpoint_url == "http://127.0.0.1:9310"


@pytest.mark.parametrize("key", ["writer", "engine"])
def test_the_writer_is_named_writer_or_by_its_old_name_engine(tmp_path, key):
    config = load_config(write(tmp_path, f"target: {{{key}: delta-spark}}\n"
                                         f"tables: [{{name: a, topic: t}}, {{name: b, topic: u, {key}: delta-rs}}]\n"))
    assert config.writer_of(config.table("a")) == "delta-spark"
    assert config.writer_of(config.table("b")) == "delta-rs"


@pytest.mark.parametrize(("text", "where"), [
    ("target: {plan_on: executors}\ntables: [{name: a, topic: t}]", "table 'a'"),
    ("target: {plan_on: executors, writer: delta-spark}\ntables: [{name: a, topic: t, writer: delta-rs}]", "table 'a'"),
    ("tables: [{name: a, topic: t, plan_on: executors}]", "table 'a'"),
    ("target: {writer: delta-spark, plan_on: executors}\n"
     "discover: {topic_pattern: 'x.*', defaults: {writer: delta-rs}}", "discover.defaults"),
])
def test_a_placement_its_writer_cannot_write_is_refused_when_the_configuration_loads(tmp_path, text, where):
    with pytest.raises(ConfigError, match=rf"{where} is planned on the executors .* written by delta-rs.*"
                                          r"choose writer: delta-spark for it, or plan_on: driver"):
        load_config(write(tmp_path, text))


def test_each_table_gets_the_placement_it_asks_for(tmp_path):
    config = load_config(write(tmp_path, "target: {writer: delta-spark, plan_on: executors}\n"
                                         "quality: {validate_on: driver}\n"
                                         "tables: [{name: a, topic: t}, {name: b, topic: u, plan_on: driver},\n"
                                         "         {name: c, topic: v, expectations: s}]\n"))
    assert [config.placement_of(config.table(n)) for n in "abc"] == ["executors", "driver", "driver"]


def test_a_variant_overrides_its_base_whichever_name_each_uses(tmp_path):
    (tmp_path / "base.yaml").write_text("target: {writer: delta-spark}\ntables: [{name: a, topic: t}]\n")
    config = load_config(write(tmp_path, "extends: base.yaml\ntarget: {engine: delta-rs}\n"))
    assert config.target.writer == "delta-rs"
    with pytest.raises(ConfigError, match=r"target: engine and writer name the same setting; keep writer"):
        load_config(write(tmp_path, "target: {engine: delta-rs, writer: delta-spark}\ntables: [{name: a, topic: t}]\n"))
