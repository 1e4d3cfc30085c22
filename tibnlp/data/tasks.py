"""Labelled classification sets by name: the manifests in `corpora/`, each split read by
`tibnlp.data.labelled` (the text form and the JSONL checks), TNCC's document task by
`tibnlp.data.tncc_document`, AdvTS for a target set; or a folder of one's own
(`tibnlp.data.folder_set`), which `load_classification` tells from a name.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tibnlp.config.finetune import TaskName
from tibnlp.data.folder_set import LAYOUT, is_folder_dataset, load_folder_set, shipped_names
from tibnlp.data.labelled import (
    LabelledSet,
    joins_spaced_syllables,
    read_checked_splits,
    read_jsonl,
)
from tibnlp.data.manifests import Manifest, all_manifests, check_label_list, get_manifest, read_json
from tibnlp.data.tncc_document import load_tncc_document
from tibnlp.errors import DataError

TNCC_TASKS = {"title": "tncc", "document": "tncc_document"}


def classification_datasets() -> list[str]:
    """Names accepted by `finetune classify --dataset` (manifests with train/validation/test)."""
    return sorted(
        name
        for name, m in all_manifests().items()
        if m.kind == "classification"
        and {"train", "validation", "test"} <= set(m.splits)
        and name != "tncc_document"
    )


def manifest_of(dataset: str, task: str = "title") -> str:
    """The manifest a fine-tuning dataset and task read: tncc's task names its own; "" for a
    folder of one's own (`is_folder_dataset`), which has none."""
    if is_folder_dataset(dataset):
        return ""
    return TNCC_TASKS.get(task, dataset) if dataset == "tncc" else dataset


def canonical_dataset(data: LabelledSet) -> tuple[str, TaskName]:
    """The set read, as one (finetune.dataset, finetune.task) whatever the command called it:
    TNCC's documents are tncc with task document (`finetune tncc --task document`), also when
    named tncc_document; a folder of one's own is its resolved folder (mine, ./mine). The
    spellings share an output folder (named by the set), so they must share the seeds' key."""
    if data.folder:
        return data.folder, "title"
    if data.manifest == TNCC_TASKS["document"]:
        return "tncc", "document"
    return data.manifest, "title"


def load_classification(dataset: str, task: str = "title") -> LabelledSet:
    """What `finetune.dataset` names: a folder of one's own (an existing folder, or a value
    with a path separator: `is_folder_dataset`), else a shipped set by its manifest name (TNCC
    with its `task`); a name that is neither is refused, saying both."""
    if is_folder_dataset(dataset):
        return load_folder_set(dataset)
    if Path(dataset).is_dir():  # a shipped set's name: the set, not the folder
        print(
            f"note: dataset '{dataset}' is the shipped set; for the folder "
            f"{Path(dataset).resolve()} give ./{dataset}",
            file=sys.stderr,
            flush=True,
        )
    if dataset == "tncc":
        return load_tncc(task)
    if dataset not in shipped_names():
        raise DataError(
            f"unknown dataset '{dataset}': no shipped set has that name, and there is no "
            f"folder {Path.cwd() / dataset}",
            f"name a shipped set ({', '.join(classification_datasets())}), or a folder of your "
            f"own, e.g. ./{dataset} (a value with a '/', or an existing folder not named like a "
            f"shipped set, is a folder), holding {LAYOUT}",
        )
    return load_dataset(dataset)


def load_tncc(task: str) -> LabelledSet:
    """TNCC title task (the published 7422/927/927 split) or document task (if downloaded)."""
    if task not in TNCC_TASKS:
        raise DataError(
            f"unknown TNCC task '{task}'", f"known tasks: {', '.join(sorted(TNCC_TASKS))}"
        )
    if task == "document":
        return load_tncc_document()
    data = load_dataset("tncc")
    data.name = "tncc-title"
    return data


def load_dataset(name: str) -> LabelledSet:
    """A classification set with train/validation/test files, as named in `corpora/NAME.yaml`."""
    if name == TNCC_TASKS["document"]:
        # the document task's own loader: it also reads the FudanNLP zip the hint asks for,
        # and names the set as `finetune tncc --task document` does (one output folder)
        return load_tncc_document()
    manifest = get_manifest(name, kind="classification")
    for split in ("train", "validation", "test"):
        if split not in manifest.splits:
            raise DataError(
                f"dataset '{name}': its manifest names no '{split}' split",
                "`finetune classify` takes the sets with train, validation and test splits: "
                + ", ".join(classification_datasets()),
            )
    files = _split_files(manifest)
    labels = manifest.labels()
    join = joins_spaced_syllables(manifest.text_form)
    splits = read_checked_splits(
        name, files, labels, manifest.text_field, manifest.label_field, join
    )
    return LabelledSet(
        name=name,
        labels=labels,
        splits=splits,
        source_form=manifest.text_form,
        max_len=manifest.max_len,
        manifest=name,
        text_field=manifest.text_field,
        label_field=manifest.label_field,
    )


def load_advts(target: str) -> LabelledSet:
    """AdvTS for `target` ('tncc' or 'tusa'): splits `adversarial` and `original` (the same
    items before the attack), both with the gold label of the source test record."""
    manifest = get_manifest("advts", kind="adversarial")
    if target not in manifest.targets:
        raise DataError(
            f"AdvTS has no set for '{target}'",
            f"AdvTS covers: {', '.join(sorted(manifest.targets))}",
        )
    rel = manifest.targets[target]
    labels = _advts_labels(manifest, Path(rel).stem)
    path = manifest.require(rel)
    adversarial = read_jsonl(path, labels, manifest.text_field, manifest.label_field)
    original = read_jsonl(path, labels, "orig_text", manifest.label_field)
    return LabelledSet(
        name=f"advts-{target}",
        labels=labels,
        splits={"adversarial": adversarial, "original": original},
        source_form=manifest.text_form,
        manifest="advts",
        text_field=manifest.text_field,
        label_field=manifest.label_field,
    )


def _split_files(manifest: Manifest) -> dict[str, Path]:
    """The split files of `manifest`, all of them there, or one error naming every one that
    is missing (before any is read)."""
    errors: list[DataError] = []
    files: dict[str, Path] = {}
    for split, rel in manifest.splits.items():
        try:
            files[split] = manifest.require(rel)
        except DataError as exc:
            errors.append(exc)
    if len(errors) > 1:
        missing = [rel for split, rel in manifest.splits.items() if split not in files]
        raise DataError(
            f"dataset '{manifest.name}': {manifest.path} lacks {', '.join(missing)}",
            errors[0].hint,
        )
    if errors:
        raise errors[0]
    return files


def _advts_labels(manifest: Manifest, key: str) -> list[str]:
    path = manifest.require(manifest.labels_file)
    data = read_json(path)
    entry = data.get(key, data) if isinstance(data, dict) else data
    if isinstance(entry, dict):
        entry = entry.get("labels")
    if not isinstance(entry, list) or not all(isinstance(x, str) for x in entry):
        raise DataError(
            f"{path}: no label list for '{key}'",
            f'restore the file: {{"{key}": {{"labels": [class names in label-id order]}}, ...}}',
        )
    return check_label_list(entry, path)
