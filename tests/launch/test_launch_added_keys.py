"""`+key=value` outside the training section: a key gptrain reads nowhere is refused by name."""

import pytest

from gptrain.errors import ConfigError
from gptrain.launch.added_keys import DATA_PREPARATION_READ, VALIDATION_READ, is_read, leaf_keys
from gptrain.launch.compose import compose, load_group
from gptrain.launch.stages import build_plan

SHARDS = [
    "cluster_type=slurm",
    "stages=[data_preparation,training]",
    "data_preparation.shards=[https://h/a.jsonl]",
]


@pytest.mark.parametrize(
    ("override", "named", "nearest"),
    [
        ("+data_preparation.keep_extractd=true", "data_preparation.keep_extractd", "data_preparation.keep_extracted"),
        ("+data_preparation.tokenizer.vocab_sise=50257", "data_preparation.tokenizer.vocab_sise",
         "data_preparation.tokenizer.vocab_size"),
        ("+validation.iter=5", "validation.iter", "validation.iters"),
        ("+contaner_image=x", "contaner_image", "container"),
    ],
)  # fmt: skip
def test_an_added_key_read_nowhere_is_refused_naming_the_nearest(override, named, nearest, tmp_path):
    """`+data_preparation.keep_extractd=true` (for keep_extracted) was taken and read by nothing: the
    extracted text was deleted as if no override had been given; `+foo.bar=1` went into the run's
    config unseen."""
    with pytest.raises(ConfigError) as error:
        build_plan(compose([*SHARDS, f"base_results_dir={tmp_path}", override]))
    where = "at the top level of a launch" if "." not in named else f"in {named.split('.')[0]}"
    assert str(error.value) == (
        f"override '{override}': gptrain reads no '{named}' {where}; the nearest key it reads there is"
        f" '{nearest}'; fix the key's spelling (+ adds a key, and only a key gptrain reads does anything),"
        " or drop the override"
    )


@pytest.mark.parametrize(
    "added",
    [
        ["+data_preparation.keep_extracted=true"],  # in the file already: + sets it as Hydra's ++ would
        ["+data_preparation.tokenizer.vocab_size=50257", "+data_preparation.tokenizer.tiktoken_pattern=v2"],
        ["+data_preparation.blend={file: /tmp/b.yaml}"],
        ["+validation.iters=3"],
        ["+env_vars.NCCL_DEBUG=INFO", "+cluster.env_vars.FOO=1"],
        ["+cluster.additional_parameters.comment=x", "+cluster.qos=high"],
        ["+FSX=/fsx", "data_dir=${FSX}/data"],  # a root an interpolation reads
        ["+numa_mapping.enable=true"],  # NeMo's, ignored with a note
        ["+run_data_preparation=True"],  # NeMo's switch, ignored beside the stages list
        ["+training.model.apply_query_key_layer_scaling=true"],  # the training schema's business
    ],
)
def test_an_added_key_gptrain_reads_or_passes_through_still_composes(added, tmp_path):
    resolved = build_plan(compose([*SHARDS, f"base_results_dir={tmp_path}", *added])).resolved
    assert resolved["stages"] == ["data_preparation", "training"]


def test_an_added_top_level_key_near_none_lists_the_keys_read_there(tmp_path):
    with pytest.raises(ConfigError) as error:
        compose([*SHARDS, "+foo.bar=1"])
    assert str(error.value).startswith(
        "override '+foo.bar=1': gptrain reads no 'foo' at the top level of a launch; it reads"
        " base_results_dir, data_dir, python, container, container_mounts, "
    )
    listed = str(error.value).split("; it reads ")[1].split("; ")[0].split(", ")
    assert "unique_output" in listed and len(listed) == len(set(listed)), listed  # each key once


@pytest.mark.parametrize("override", ["+data_preparation.zzzzqqq=1", "+validation.xyz=1"])
def test_an_added_section_key_near_none_lists_the_keys_read_there(override, tmp_path):
    """The section's prefix, shared by every key there, made any key "near" one of them."""
    with pytest.raises(ConfigError) as error:
        build_plan(compose([*SHARDS, f"base_results_dir={tmp_path}", override]))
    section = override[1:].split(".")[0]
    assert "nearest" not in str(error.value) and f" in {section}; it reads {section}." in str(error.value)


def pile_tree(tmp_path):
    """A launcher tree whose data_preparation is NeMo's download_gpt3_pile.yaml (its own key names)."""
    (tmp_path / "data_preparation").mkdir()
    (tmp_path / "config.yaml").write_text(
        "defaults:\n  - _self_\n  - data_preparation: pile\nstages: [data_preparation]\n"
        f"cluster_type: local\nbase_results_dir: {tmp_path}/results\ndata_dir: {tmp_path}/data\n"
    )
    (tmp_path / "data_preparation" / "pile.yaml").write_text(
        "run:\n  name: download_gpt3_pile\n  results_dir: ${base_results_dir}/${.name}\n"
        "the_pile_url: https://h/pile/train/\nfile_numbers: '0-1'\nrm_downloaded: True\n"
    )
    return tmp_path


def test_an_added_key_of_nemo_pile_download_is_checked_against_its_own_keys(tmp_path):
    tree = pile_tree(tmp_path)
    section = compose(["+data_preparation.rm_extracted=False"], tree).resolved()["data_preparation"]
    assert section["keep_extracted"] is True
    with pytest.raises(ConfigError) as error:
        compose(["+data_preparation.rm_extractd=False"], tree)
    assert "reads no 'data_preparation.rm_extractd'" in str(error.value)
    assert "nearest key it reads there is 'data_preparation.rm_extracted'" in str(error.value)


@pytest.mark.parametrize(
    ("group", "read"), [("data_preparation", DATA_PREPARATION_READ), ("validation", VALIDATION_READ)]
)
def test_every_key_of_the_bundled_stage_files_counts_as_read(group, read):
    """A key added to configs/<group>/ and read by the stage must be in its list, or `+<group>.<key>`
    in a tree whose file lacks it would be refused."""
    choice = {"data_preparation": "download_shards", "validation": "default"}[group]
    assert sorted(leaf_keys("", load_group(group, choice)))  # the file has keys
    for key in leaf_keys("", load_group(group, choice)):
        assert is_read(f"{group}{key}", tuple(f"{group}.{k}" for k in read)), key
