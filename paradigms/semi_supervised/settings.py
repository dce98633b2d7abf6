"""What one semi-supervised run is: :class:`SemiSupervisedSettings`, validated on construction.

Two groups of settings are units of their own: :class:`PseudoLabelSettings` (``pseudo.*``: how the
pseudo-label maker chooses labels and how much the trainer trusts them; ``pseudo.selection="auto"``
takes the data set's preset, :func:`pseudo_preset`) and
:class:`~carls_dask.paradigms.semi_supervised.teacher.GraphTeacherSettings` (``graph_teacher.*``: the
separate graph model the maker may train instead of using the student). The command line names
their fields ``-o pseudo.weight=2``; the flat names they had before (``-o pseudo_weight=2``) still work.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from carls_dask.paradigms.data.graphs import GRAPH_NAMES, graph_family, graph_unlabelled_batch
from carls_dask.paradigms.semi_supervised.loss import DISTANCES
from carls_dask.paradigms.semi_supervised.teacher import GraphTeacherSettings
from carls_dask.runtime.settings import check_settings

__all__ = ["ALL_NODES", "MAKER_REFRESH", "MODES", "PSEUDO_SELECTIONS", "PSEUDO_TEACHERS", "PseudoLabelSettings",
           "SemiSupervisedConfig", "SemiSupervisedSettings", "pseudo_preset"]

MODES = ("base", "in-graph", "bank")
PSEUDO_SELECTIONS = ("threshold", "balanced", "soft", "auto")
PSEUDO_TEACHERS = ("student", "graph")
#: What the neighbour maker re-scores each round (see ``SemiSupervisedSettings.maker_refresh``).
MAKER_REFRESH = ("full", "changes")

#: An ``unlabelled_batch`` of at least this many nodes asks for every unlabelled node of the graph (more
#: than any Planetoid graph has); on WordNet it stands for
#: :data:`~carls_dask.paradigms.data.graphs.WORDNET_UNLABELLED_BATCH` instead.
ALL_NODES = 1_000_000

_OWNER = "semi-supervised settings"

#: The pseudo-label settings ``pseudo.selection="auto"`` stands for, by family of graphs (chosen on each
#: family's validation split; the comparison is in docs/results.md): on the Planetoid graphs, soft targets
#: distilled from the student's corrected and propagated predictions (on CiteSeer from the graph teacher);
#: on WordNet class-balanced hard labels without the agreement test.
_PLANETOID_PRESET: dict[str, Any] = {"selection": "soft", "weight": 10.0, "temperature": 0.6, "alpha": 0.8,
                                     "correct_alpha": 0.99, "propagation_steps": 50}
_PRESETS: dict[str, dict[str, Any]] = {
    "planetoid": _PLANETOID_PRESET,
    "citeseer": {**_PLANETOID_PRESET, "teacher": "graph"},
    "wordnet": {"selection": "balanced", "weight": 0.5, "fraction": 0.4, "ramp": 50, "agreement": False},
}


def pseudo_preset(dataset: str) -> dict[str, Any]:
    """The :class:`PseudoLabelSettings` fields ``selection="auto"`` sets on the graph ``dataset``.

    Raises
    ------
    ConfigError
        If ``dataset`` is not one of :data:`~carls_dask.paradigms.data.graphs.GRAPH_NAMES`.
    """
    family = graph_family(dataset)
    return dict(_PRESETS.get(str(dataset).lower(), _PRESETS[family]))


@dataclasses.dataclass(frozen=True)
class PseudoLabelSettings:
    """How the pseudo-label maker labels the unlabelled nodes, and how much the trainer trusts its labels.

    Attributes
    ----------
    selection
        How pseudo labels are chosen: "threshold" (every unlabelled node whose model confidence passes
        pseudo.threshold), "balanced" (per class, the nodes whose neighbour vote is most confident and
        agrees with the model, up to pseudo.fraction of them in all), "soft" (every unlabelled node gets
        its sharpened neighbour vote as a soft target) or "auto" (the data set's preset: soft targets on
        Cora and CiteSeer, balanced labels on WordNet). The preset sets the pseudo-label fields left at
        their defaults; a field set to its default value cannot be told from an unset one and takes the
        preset's value (give "soft" or "balanced" to run such a value).
    weight
        Multiplier of the pseudo-label term in the trainer's loss (none: 10 for soft targets, 0.5 for
        hard labels).
    threshold
        Confidence a prediction needs to become a pseudo label (selection "threshold").
    fraction
        Share of the unlabelled nodes that may get a pseudo label (selection "balanced").
    alpha
        Neighbour weight of the label propagation that makes the neighbour votes (0: the model alone).
    agreement
        Require the model's class and the neighbour vote's class to agree (selection "balanced").
    temperature
        Sharpening temperature of the soft targets (selection "soft"; 1 leaves the votes as they are).
    confidence_weight
        Weight each soft target's loss by its confidence (selection "soft"; otherwise every target weighs 1).
    correct_alpha
        Neighbour weight of the correct step before the label propagation (0: off): the model's errors on
        the labelled-train nodes are spread over the graph and added to its probabilities
        (correct-and-smooth).
    correct_scale
        Multiplier of the spread errors in the correct step (0: each row scaled to the mean size of the
        labelled-train errors).
    teacher
        Whose class probabilities the pseudo labels come from: "student" (the newest model version,
        corrected and propagated over the graph) or "graph" (a separate graph model the maker trains once,
        see graph_teacher.*; its probabilities replace the votes, only the sharpening applies). The trainer
        stays an MLP either way. none: "graph" on CiteSeer under selection "auto", else "student".
    propagation_steps
        Rounds of the label propagation that makes the neighbour votes, and of the correct step.
    warmup
        Model step before which no pseudo label is given.
    ramp
        Steps after the warm-up over which the labelled share grows linearly to pseudo.fraction
        (0: all at once).
    """

    selection: str = "threshold"
    weight: float | None = None
    threshold: float = 0.6
    fraction: float = 0.3
    alpha: float = 0.9
    agreement: bool = True
    temperature: float = 1.0
    confidence_weight: bool = False
    correct_alpha: float = 0.0
    correct_scale: float = 0.0
    teacher: str | None = None
    propagation_steps: int = 10
    warmup: int = 0
    ramp: int = 0

    def __post_init__(self) -> None:
        check_settings(_OWNER, (
            (self.selection in PSEUDO_SELECTIONS,
             f"pseudo.selection {self.selection!r}, expected one of {PSEUDO_SELECTIONS}"),
            (self.weight is None or self.weight >= 0, f"pseudo.weight {self.weight!r}, expected >= 0"),
            (0.0 < self.threshold <= 1.0, f"pseudo.threshold {self.threshold!r}, expected a value in (0, 1]"),
            (0.0 <= self.fraction <= 1.0, f"pseudo.fraction {self.fraction!r}, expected a value in [0, 1]"),
            (0.0 <= self.alpha < 1.0, f"pseudo.alpha {self.alpha!r}, expected a value in [0, 1)"),
            (int(self.warmup) >= 0, f"pseudo.warmup {self.warmup!r}, expected an integer >= 0"),
            (int(self.ramp) >= 0, f"pseudo.ramp {self.ramp!r}, expected an integer >= 0"),
            (self.temperature > 0, f"pseudo.temperature {self.temperature!r}, expected > 0"),
            (0.0 <= self.correct_alpha < 1.0,
             f"pseudo.correct_alpha {self.correct_alpha!r}, expected a value in [0, 1)"),
            (self.correct_scale >= 0, f"pseudo.correct_scale {self.correct_scale!r}, expected >= 0 (0: autoscale)"),
            (self.teacher is None or self.teacher in PSEUDO_TEACHERS,
             f"pseudo.teacher {self.teacher!r}, expected one of {PSEUDO_TEACHERS}"),
            (int(self.propagation_steps) >= 0,
             f"pseudo.propagation_steps {self.propagation_steps!r}, expected an integer >= 0"),
        ))

    def for_dataset(self, dataset: str) -> PseudoLabelSettings:
        """These settings as a run on ``dataset`` uses them: the preset applied under ``selection="auto"``
        (to the fields left at their defaults), then ``weight`` and ``teacher`` given their defaults."""
        out = self
        if self.selection == "auto":
            defaults = PseudoLabelSettings()
            out = dataclasses.replace(self, **{
                name: value for name, value in pseudo_preset(dataset).items()
                if name == "selection" or getattr(self, name) == getattr(defaults, name)})
        if out.weight is None:
            out = dataclasses.replace(out, weight=10.0 if out.selection == "soft" else 0.5)
        if out.teacher is None:
            out = dataclasses.replace(out, teacher="student")
        return out


@dataclasses.dataclass(frozen=True)
class SemiSupervisedSettings:
    """Every choice of a semi-supervised run, shared by every variant.

    Attributes
    ----------
    dataset
        The graph: "cora", "citeseer", "wordnet" (WordNet nouns, gloss features from the sentence encoder
        when it is installed, else TF-IDF) or "wordnet-tfidf".
    mode
        Where the graph term's neighbour outputs come from: "base" (no graph term), "in-graph" (a forward
        pass over every neighbour inside the step) or "bank" (looked up in the bank, where a maker writes them).
    k
        Neighbour slots per node.
    steps
        Optimizer steps of the trainer.
    hidden
        Widths of the MLP's hidden layers.
    dropout
        Dropout rate of the MLP.
    lr
        Learning rate of the trainer's Adam optimizer.
    weight_decay
        Weight decay of the trainer's Adam optimizer.
    unlabelled_batch
        Unlabelled nodes drawn per step beside all labelled-train nodes (the graph term covers both);
        1000000 or more asks for every unlabelled node, which on WordNet means 2048.
    graph_weight
        Multiplier of the graph-regularization term.
    distance
        Distance of the graph term between a node's and its neighbours' outputs: "kl" or "l2".
    neighbour_temperature
        Neighbour logits are divided by it before the graph term: values below 1 sharpen the
        neighbours' distributions into firmer targets (1 leaves them as they are).
    graph_warmup
        Trainer steps before which the graph term is off (the run starts as the base MLP).
    pseudo_labels
        Add the pseudo-label term (mode "bank" only: a maker writes the pseudo labels to the bank).
    pseudo
        How pseudo labels are chosen and weighed (:class:`PseudoLabelSettings`).
    graph_teacher
        The graph teacher the pseudo-label maker trains with pseudo.teacher "graph"
        (:class:`~carls_dask.paradigms.semi_supervised.teacher.GraphTeacherSettings`).
    eval_every
        Steps between validation evaluations (the best-validation model is the one reported).
    seed
        Seed of weights, dropout and batch sampling.
    neighbour_seed
        Seed of the neighbour-table sampling.
    publish_every
        Trainer steps between model versions the makers pick up.
    data_dir
        Folder of the data sets (none: carls.data.dir, then CARLS_DATA_DIR, then the data folder beside
        the checkout).
    torch_threads
        Intra-op threads torch may use in each loop (0 leaves torch's default).
    maker_refresh
        What the neighbour maker re-scores each round: "full" (every node) or "changes" (the nodes the
        bank's change feed says moved since its last round and their graph neighbours, plus a slow sweep
        of sweep_fraction of the nodes so that none is starved).
    refresh_threshold
        L2 distance between a node's new and last reported logits above which the change feed counts it as moved.
    sweep_fraction
        Share of the nodes a "changes" maker re-scores each round in a fixed cycle, whatever moved.
    refresh_neighbours
        Whether a "changes" maker also re-scores the graph neighbours of the nodes that moved (off:
        the moved nodes and the sweep only).
    audit_nodes
        Nodes (a fixed sample) on which the trainer measures, at each evaluation, how far the bank's logits
        are from its current model's: the staleness of the knowledge it reads (0: no audit).
    """

    #: The flat names these settings had before ``pseudo`` and ``graph_teacher`` were groups.
    renamed: ClassVar[dict[str, str]] = {
        "pseudo_weight": "pseudo.weight", "threshold": "pseudo.threshold", "pseudo_selection": "pseudo.selection",
        "pseudo_fraction": "pseudo.fraction", "pseudo_alpha": "pseudo.alpha", "pseudo_agreement": "pseudo.agreement",
        "pseudo_temperature": "pseudo.temperature", "pseudo_confidence_weight": "pseudo.confidence_weight",
        "pseudo_correct_alpha": "pseudo.correct_alpha", "pseudo_correct_scale": "pseudo.correct_scale",
        "pseudo_teacher": "pseudo.teacher", "propagation_steps": "pseudo.propagation_steps",
        "pseudo_warmup": "pseudo.warmup", "pseudo_ramp": "pseudo.ramp", "teacher_epochs": "graph_teacher.epochs",
    }

    dataset: str = "cora"
    mode: str = "bank"
    k: int = 5
    steps: int = 300
    hidden: tuple[int, ...] = (64,)
    dropout: float = 0.5
    lr: float = 0.01
    weight_decay: float = 5e-4
    unlabelled_batch: int = 512
    graph_weight: float = 1.0
    distance: str = "kl"
    neighbour_temperature: float = 1.0
    graph_warmup: int = 0
    pseudo_labels: bool = False
    pseudo: PseudoLabelSettings = dataclasses.field(default_factory=PseudoLabelSettings)
    graph_teacher: GraphTeacherSettings = dataclasses.field(default_factory=GraphTeacherSettings)
    eval_every: int = 10
    seed: int = 0
    neighbour_seed: int = 0
    publish_every: int = 10
    data_dir: str | None = None
    torch_threads: int = 1
    maker_refresh: str = "full"
    refresh_threshold: float = 2.0
    sweep_fraction: float = 0.05
    refresh_neighbours: bool = True
    audit_nodes: int = 256

    def __post_init__(self) -> None:
        check_settings(_OWNER, (
            (str(self.dataset).lower() in GRAPH_NAMES, f"dataset {self.dataset!r}, expected one of {GRAPH_NAMES}"),
            (isinstance(self.pseudo, PseudoLabelSettings),
             f"pseudo {self.pseudo!r}, expected a PseudoLabelSettings"),
            (isinstance(self.graph_teacher, GraphTeacherSettings),
             f"graph_teacher {self.graph_teacher!r}, expected a GraphTeacherSettings"),
        ))
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        object.__setattr__(self, "pseudo", self.pseudo.for_dataset(self.dataset))
        object.__setattr__(self, "unlabelled_batch",
                           graph_unlabelled_batch(self.dataset, self.unlabelled_batch, every=ALL_NODES))
        check_settings(_OWNER, (
            (self.mode in MODES, f"mode {self.mode!r}, expected one of {MODES}"),
            (self.distance in DISTANCES, f"distance {self.distance!r}, expected one of {DISTANCES}"),
            (int(self.k) >= 1, f"k {self.k!r}, expected an integer >= 1"),
            (int(self.steps) >= 1, f"steps {self.steps!r}, expected an integer >= 1"),
            (int(self.eval_every) >= 1, f"eval_every {self.eval_every!r}, expected an integer >= 1"),
            (int(self.publish_every) >= 1, f"publish_every {self.publish_every!r}, expected an integer >= 1"),
            (int(self.torch_threads) >= 0, f"torch_threads {self.torch_threads!r}, expected an integer >= 0"),
            (int(self.unlabelled_batch) >= 0, f"unlabelled_batch {self.unlabelled_batch!r}, expected >= 0"),
            (0.0 <= self.dropout < 1.0, f"dropout {self.dropout!r}, expected a value in [0, 1)"),
            (self.lr > 0, f"lr {self.lr!r}, expected > 0"),
            (self.neighbour_temperature > 0,
             f"neighbour_temperature {self.neighbour_temperature!r}, expected > 0"),
            (not (self.pseudo_labels and self.mode != "bank"), "pseudo_labels need mode 'bank'"),
            (int(self.graph_warmup) >= 0, f"graph_warmup {self.graph_warmup!r}, expected an integer >= 0"),
            (self.maker_refresh in MAKER_REFRESH, f"maker_refresh {self.maker_refresh!r}, expected one of {MAKER_REFRESH}"),
            (self.refresh_threshold >= 0, f"refresh_threshold {self.refresh_threshold!r}, expected >= 0"),
            (0.0 < self.sweep_fraction <= 1.0, f"sweep_fraction {self.sweep_fraction!r}, expected a value in (0, 1]"),
            (int(self.audit_nodes) >= 0, f"audit_nodes {self.audit_nodes!r}, expected an integer >= 0"),
        ))


#: The name these settings had before every paradigm's settings class was called ``<Paradigm>Settings``.
SemiSupervisedConfig = SemiSupervisedSettings
