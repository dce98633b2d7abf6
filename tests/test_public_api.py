"""The public surface of each public package, pinned: a change to an ``__all__`` is a change to this test.

Every name listed must resolve (lazily loaded names included), and nothing private is listed.
"""

from __future__ import annotations

import importlib

import pytest

PUBLIC = {
    "carls_dask": [
        "CarlsError", "Column", "Dashboard", "KnowledgeBank", "KnowledgeMaker", "LookupResult", "MetricWriter",
        "TableSpec", "Trainer", "Workbench", "__version__", "config", "open_bank", "open_metrics",
    ],
    "carls_dask.bank": [
        "BankShard", "ChangeBatch", "ChangeCursor", "ChangeWatch", "Column", "KnowledgeBank", "LookupResult", "NegativeSample", "ShardCore", "TableSpec",
        "bucket_of", "hash_string", "nodes_table", "to_int64_keys",
    ],
    "carls_dask.runtime": [
        "Checkpointer", "KnowledgeMaker", "Lifecycle", "LocalModelChannel", "LoopContext", "LoopHandle", "LoopResult",
        "LoopStatus", "MakerDriver", "MakerRound", "ModelChannel", "ModelVersion", "Paradigm", "RunResult", "State",
        "ThreadStop", "Trainer", "TrainerDriver", "Workbench", "available_paradigms", "get_paradigm", "pick_device",
        "register_paradigm", "resume_run", "run_inline", "run_loop", "run_maker", "run_paradigm", "run_trainer",
    ],
    "carls_dask.storage": [
        "BankReplay", "CarlsError", "DeltaLog", "DeltaRecord", "MetricWriter", "RowBatch", "SnapshotHandle",
        "begin_snapshot", "commit_snapshot", "list_snapshots", "open_bank", "open_metrics", "open_snapshot",
        "prune_snapshots",
        "read_bank", "read_manifest", "read_snapshot", "replay", "write_shard",
    ],
    "carls_dask.dashboards": ["Dashboard", "RunReader", "inline_resources"],
    "carls_dask.loading": [
        "ArraySpec", "ConsumerDetached", "LoaderClosed", "LoaderConsumer", "LoaderError", "ProducerLost",
        "SharedLoader", "attach", "loader_exists", "shared_memory_available", "shared_memory_free",
    ],
    "carls_dask.memory": [
        "BankGaussianMemory", "DynamicNormalization", "GaussianMemory", "LookupMode", "MemoryConfig",
        "MemoryLookupResult", "MemoryState", "memory_lookup", "memory_table",
    ],
    "carls_dask.dashboards.views": ["CompareView", "CurriculumView", "DriftView", "HealthView", "LearningView", "PseudoLabelView"],
    "carls_dask.paradigms": [],
    "carls_dask.paradigms.data": [],
    "carls_dask.paradigms.multimodal": ["Multimodal", "MultimodalSettings"],
    "carls_dask.paradigms.multimodal.paradigm": ["Multimodal", "RECALLS"],
    "carls_dask.paradigms.multimodal.settings": ["MultimodalSettings", "NEGATIVES"],
    "carls_dask.paradigms.semi_supervised": [
        "NodeClassifierCore", "PseudoLabelSettings", "SemiSupervised", "SemiSupervisedConfig", "SemiSupervisedSettings",
    ],
    "carls_dask.paradigms.curriculum": [
        "BANK_COLUMNS", "CLEAN_MODES", "PACING_SCHEDULES", "SCORERS", "TABLE", "CleaningRule", "Curriculum",
        "CurriculumData", "CurriculumSampler", "CurriculumSettings", "CurriculumTrainer", "DifficultyMaker",
        "FractionPacing", "NoisyLabels", "Pacing", "SelfPacedPacing", "clean_targets", "detection_quality",
        "difficulty_table", "get_scorer", "load_data", "make_model", "make_pacing", "register_scorer",
        "symmetric_noise",
    ],
}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_surface_is_pinned(name: str) -> None:
    module = importlib.import_module(name)
    assert sorted(module.__all__) == sorted(PUBLIC[name]), f"{name}.__all__ changed"
    for attr in module.__all__:
        assert getattr(module, attr) is not None, f"{name}.{attr} does not resolve"
        assert not attr.startswith("_") or attr == "__version__", f"{name} lists the private name {attr}"
