"""Move a pre-trained UniSRec to a new domain (Hou et al., KDD 2022, Sec. 3.4).

    inductive     item = MoE(text); the Transformer (and positions, input LN) frozen, the adaptor trained
    transductive  item = MoE(text) + E_id[item]; the ID table is new, trained with the adaptor
    zero-shot     item = MoE(text) with the pre-trained weights as they are: no target event trains
                  anything; the target's item text alone moves the model to its catalogue

After fine-tuning, the weights a x fine-tuned + (1 - a) x pre-trained (each a of `train.interpolate`) are
validated too, and kept when one beats both ends (weight-space ensembling, Wortsman et al., CVPR 2022):
what fine-tuning on a few users learns is added to what pre-training knew rather than replacing it. Only
the tensors the pre-trained run carried over are mixed; new ones (an ID table) keep their fine-tuned values.

Everything that does not name an item (adaptor, positions, Transformer) is
copied from the pre-trained checkpoint; the text buffer is the new domain's,
the ID table (transductive) starts from zero-mean noise. A history bias
(`model.history_bias`) starts from the pre-trained one when the checkpoint has it (pre-training
with `model.history_bias = true` learns one for every domain: whether users come back to an item),
from zero otherwise; with `--transfer adaptor` always from zero.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from safetensors.torch import load_file

from seqrec.config import build
from seqrec.data.dataset import PreparedDataset
from seqrec.data.io import read_json
from seqrec.data.sketch import contained, events_sketch
from seqrec.errors import SeqrecError, not_a_run
from seqrec.models.unisrec import UniSRec, UniSRecConfig
from seqrec.train.checkpoint import file_digest, load_checkpoint, read_meta, save_checkpoint, verify_checkpoint

if TYPE_CHECKING:
    from seqrec.config import RunConfig
    from seqrec.models.base import SequentialModel
    from seqrec.train.state import LoopState

log = logging.getLogger(__name__)

Setting = Literal["inductive", "transductive"]
# tensors that belong to one catalogue
PER_DOMAIN = ("text_emb", "text_mean", "item_emb.weight", "sampler.counts")  # the last: a sampled loss's popularity
HISTORY = "history.theta"  # carried over when both models have a history bias
# model settings that fix the shape or the meaning of pre-trained weights: the checkpoint decides them (the
# adaptor learnt from the vectors of one encoder, pooling and length, centred or not)
ARCHITECTURE = ("d", "n_layers", "n_heads", "d_ff", "n_experts", "text_dim", "text_encoder", "text_revision",
                "text_pooling", "text_max_length", "text_centre")
# settings of the pre-training domains, not of a target: a target takes the model's default unless given
PER_TARGET = ("text_missing",)
SEEN_SHARE = 0.5  # a target of which a pre-training domain holds this share of the events is no zero-shot target


def checkpoint_dir(path: Path) -> Path:
    path = Path(path)
    ckpt = path / "checkpoint" if (path / "checkpoint").is_dir() else path
    if not (ckpt / "model.json").is_file():
        raise not_a_run(path, "checkpoint/model.json")
    return ckpt


def finetune_config(pretrained: Path, setting: Setting, overrides: dict[str, Any] | None = None) -> UniSRecConfig:
    """The pre-trained model's config with the setting's switches (and any explicit overrides) applied."""
    if setting not in ("inductive", "transductive"):
        raise SeqrecError(f"setting must be inductive or transductive, got {setting!r}")
    meta = read_meta(checkpoint_dir(pretrained))
    if meta.get("model") != "unisrec":
        raise SeqrecError(f"{pretrained}: fine-tuning needs a UniSRec checkpoint, got {meta.get('model')!r}")
    overrides = dict(overrides or {})
    item_ids = setting == "transductive"  # the setting decides; a contradicting override is an error
    if overrides.pop("item_ids", item_ids) != item_ids:
        raise SeqrecError(f"model.item_ids contradicts --setting {setting}; drop it from the config")
    targets = {f.name: f.default for f in dataclasses.fields(UniSRecConfig) if f.name in PER_TARGET}
    values = {**meta["config"], **targets, "freeze_encoder": True, "whitening_init": False, **overrides,
              "item_ids": item_ids}
    return build(UniSRecConfig, values, "model")


def recipe_model_settings(pretrained: Path, recipe: dict[str, Any]) -> dict[str, Any]:
    """A fine-tuning recipe's `[model]` settings less the architecture the pre-trained checkpoint fixes, so a
    recipe written for another model size still applies its dropout, temperature, ...; each setting
    dropped is logged. (An explicit `--set` of an architecture key is not passed through here: it must
    match the checkpoint or the weights do not load.)"""
    pre = read_meta(checkpoint_dir(pretrained))["config"]
    dropped = {k: v for k, v in recipe.items() if k in ARCHITECTURE and k in pre and v != pre[k]}
    for key, value in dropped.items():
        log.info("model.%s = %s from the pre-trained model (the config's %s does not fit its weights)",
                 key, pre[key], value)
    return {k: v for k, v in recipe.items() if k not in dropped}


def check_architecture(pretrained: Path, given: dict[str, Any]) -> None:
    """An explicit `--set model.KEY=V` of an architecture key must be the pre-trained checkpoint's own."""
    pre = read_meta(checkpoint_dir(pretrained))["config"]
    for key, value in given.items():
        if key in ARCHITECTURE and key in pre and value != pre[key]:
            what = "text encoding" if key.startswith("text_") else "architecture"
            raise SeqrecError(f"model.{key}={value} does not fit the pre-trained model (its {key} is {pre[key]}): "
                              f"a model started from it (fine-tuned or zero-shot) keeps its {what}; drop the "
                              "setting")


Transfer = Literal["all", "adaptor"]


def finetune_model(pretrained: Path, data: PreparedDataset, config: UniSRecConfig, max_len: int,
                   transfer: Transfer = "all", trained: bool = True) -> UniSRec:
    """A UniSRec for `data` carrying the shared weights of the pre-trained checkpoint: every one ("all"),
    or only the text adaptor's ("adaptor": the Transformer and positions start afresh, from the seed)."""
    if transfer not in ("all", "adaptor"):
        raise SeqrecError(f"transfer must be all or adaptor, got {transfer!r}")
    ckpt = checkpoint_dir(pretrained)
    verify_checkpoint(ckpt)  # a corrupt or truncated file is a one-line error, not a loader's traceback
    meta = read_json(ckpt / "model.json")
    if int(meta["max_len"]) != max_len:
        raise SeqrecError(f"pre-trained with max_len={meta['max_len']}; fine-tune with data.max_len={meta['max_len']}")
    model = UniSRec.from_dataset(config, data, max_len)
    state = {k: v for k, v in load_file(str(ckpt / "model.safetensors")).items() if k not in PER_DOMAIN}
    if model.history is None:
        state.pop(HISTORY, None)
    if transfer == "adaptor":
        fresh = model.state_dict()
        state = {k: (v if k.startswith("adaptor.") else fresh[k]) for k, v in state.items()}
    fit = "the architecture keys (d, n_layers, n_experts, ...) must match the pre-trained model"
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a tensor of another shape
        first = (str(exc).splitlines()[1:] or [str(exc)])[0].strip()  # the first mismatch
        raise SeqrecError(f"{ckpt}: weights do not fit ({first}); {fit}") from None
    if unexpected or set(missing) - {*PER_DOMAIN, HISTORY}:
        raise SeqrecError(f"{ckpt}: weights do not fit (missing {missing}, unexpected {unexpected}); {fit}")
    if model.item_emb is not None:  # transductive: the new ID vectors start at zero, so the model fine-tuning
        with torch.no_grad():  # starts from (validated as its epoch 0) is the zero-shot one
            model.item_emb.weight.zero_()
    if trained:  # (zero-shot uses it as it is: nothing is trained)
        n_frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
        log.info("fine-tuning from %s: %d parameters frozen, %d trained", ckpt, n_frozen,
                 sum(p.numel() for p in model.parameters() if p.requires_grad))
    return model


def _meta_digest(pretrained: Path) -> str:
    return str(file_digest(checkpoint_dir(pretrained) / "model.json")["sha256"])


def saved_tensors(pretrained: Path) -> set[str]:
    """The names of the tensors a pre-trained checkpoint holds (its weight file's header; nothing loaded)."""
    from safetensors import safe_open

    with safe_open(str(checkpoint_dir(pretrained) / "model.safetensors"), "pt") as f:
        return set(f.keys())


@dataclass(frozen=True)
class Origin:
    """Where a fine-tuned model starts: the pre-trained run and what it carries over. A refit, a resumed run
    and the weight interpolation start from it again (`seqrec.train.loop.fit`); runs record it."""

    pretrained: str  # the run's absolute path
    transfer: Transfer = "all"
    digest: str = ""  # sha256 of its checkpoint's model.json (which holds every weight file's sha256)

    @classmethod
    def of(cls, pretrained: Path, transfer: Transfer = "all") -> Origin:
        return cls(str(Path(pretrained).resolve()), transfer, _meta_digest(Path(pretrained)))

    def model(self, data: PreparedDataset, config: UniSRecConfig, max_len: int, seed: int) -> UniSRec:
        """The model fine-tuning starts from; its new weights (an ID table, ...) drawn from `seed`, so that a
        resumed run builds the same one. A pre-trained run changed since the digest was taken is refused."""
        if self.digest and _meta_digest(Path(self.pretrained)) != self.digest:
            raise SeqrecError(f"{self.pretrained}: the pre-trained run changed since this fine-tuning started from it "
                              "(trained again?); its starting point is gone, so fine-tune again (--overwrite)")
        torch.manual_seed(seed)
        return finetune_model(Path(self.pretrained), data, config, max_len, self.transfer)

    def weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """A copy of `model`'s tensors that come from the pre-trained run (every shared one, or the adaptor's),
        as they are now (`model` not yet trained: the pre-trained values)."""
        saved = saved_tensors(Path(self.pretrained))
        return {k: v.detach().clone() for k, v in model.state_dict().items() if k in saved and k not in PER_DOMAIN
                and v.is_floating_point() and (self.transfer == "all" or k.startswith("adaptor."))}


def mix(model: SequentialModel, start: dict[str, torch.Tensor], alpha: float,
        tuned: dict[str, torch.Tensor] | None = None) -> SequentialModel:
    """`model` (in place) with its tensors named in `start` (their pre-trained values) set to alpha x fine-tuned
    + (1 - alpha) x pre-trained; the fine-tuned values are `tuned` (copies taken before an earlier mix) or the
    model's own. Only those tensors are touched, so no second copy of the model is needed."""
    state = model.state_dict()
    with torch.no_grad():
        for name, begin in start.items():
            end = state[name] if tuned is None else tuned[name]
            state[name].copy_(torch.lerp(begin.to(end.device), end, alpha))
    return model


def unmix(model: SequentialModel, start: dict[str, torch.Tensor], alpha: float) -> dict[str, torch.Tensor]:
    """The fine-tuned values of the tensors named in `start` (pre-trained values) of a model saved mixed at
    `alpha` (its checkpoint's `interpolated`): start + (mixed - start) / alpha."""
    if not 0 < alpha <= 1:
        raise SeqrecError(f"a model mixed at {alpha:g} x fine-tuned keeps nothing of its fine-tuned weights")
    state = {k: v.detach() for k, v in model.state_dict().items() if k in start}
    begin = {k: v.to(state[k].device) for k, v in start.items()}
    return {k: begin[k] + (state[k] - begin[k]) / alpha for k in start}


def interpolate_best(cfg: RunConfig, data: PreparedDataset, device: torch.device, ckpt: Path,
                     start: dict[str, torch.Tensor], loop: LoopState, metric: str) -> dict[str, Any]:
    """Validate the chosen fine-tuned checkpoint mixed with its pre-trained weights (`start`) at each weight of
    `train.interpolate`; save the best mix as the checkpoint when it beats the validation best so far (the
    fine-tuned model and, as epoch 0, the pre-trained one). -> what was tried and the weight kept (1: none)."""
    if loop.best_epoch == 0:  # validation kept the pre-trained model: every mix is that model
        return {"alpha": 1.0, "valid": {}, "skipped": "validation chose the pre-trained model (epoch 0)"}
    from seqrec.eval.evaluate import evaluate

    model, meta = load_checkpoint(ckpt, device)
    if isinstance(meta.get("interpolation"), dict):  # mixed and saved already: stopped before the state said so
        done = meta["interpolation"]
        loop.best = done["valid"][f"{done['alpha']:g}"]
        return dict(done)
    state = model.state_dict()
    ends = {name: state[name].detach().clone() for name in start}  # the fine-tuned values
    tried = {}
    for alpha in cfg.train.interpolate:
        mix(model, start, alpha, ends)
        tried[alpha] = evaluate(model, data, "valid", cfg.data.max_len, cfg.eval, device)[metric]
        log.info("fine-tuned weights x %g + pre-trained x %g: %s %.4f (fine-tuned alone %.4f)", alpha, 1 - alpha,
                 metric, tried[alpha], loop.best)
    best = max(tried, key=lambda a: tried[a])
    out: dict[str, Any] = {"alpha": 1.0, "valid": {f"{a:g}": v for a, v in tried.items()}, "fine_tuned": loop.best}
    if tried[best] > loop.best:
        loop.best, out["alpha"] = tried[best], best
        save_checkpoint(mix(model, start, best, ends), ckpt, max_len=cfg.data.max_len, item_table=data.item_table,
                        extra={"epoch": meta.get("epoch", loop.best_epoch), "interpolated": best, "interpolation": out,
                               "dataset_fingerprint": data.fingerprint})
        log.info("kept the mix %g x fine-tuned + %g x pre-trained (validation %s %.4f)", best, 1 - best, metric,
                 loop.best)
    return out


def has_history_bias(pretrained: Path) -> bool:
    """Whether the pre-trained checkpoint holds history-bias offsets (`model.history_bias = true`)."""
    return HISTORY in saved_tensors(pretrained)


def is_pretrain_run(path: Path) -> bool:
    """A `seqrec pretrain` run folder (its config.json has a `pretrain` section)."""
    config = Path(path) / "config.json"
    return config.is_file() and isinstance(data := read_json(config), dict) and "pretrain" in data


def pretrained_max_len(pretrained: Path) -> int:
    return int(read_json(checkpoint_dir(pretrained) / "model.json")["max_len"])


def zero_shot_config(pretrained: Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """A run config for the pre-trained model on a new domain: its model (text only), its max_len."""
    from seqrec.config import resolve

    model = finetune_config(pretrained, "inductive", overrides)
    return resolve({"model": dataclasses.asdict(model), "data": {"max_len": pretrained_max_len(pretrained)},
                    "train": {"refit": False}})


def check_unseen(pretrained: Path, data: PreparedDataset) -> None:
    """A `SeqrecError` where `pretrained`'s weights already learnt from `data`: a pre-training domain (its data
    card), or the dataset it was trained, fine-tuned or used zero-shot on (its checkpoint); no zero-shot then."""
    trained_on = read_meta(checkpoint_dir(pretrained)).get("dataset_fingerprint")
    card = Path(pretrained) / "data_card.json"
    domains = read_json(card).get("domains", []) if card.is_file() else []
    name = data.meta["name"]
    zero = f"zero-shot means no event of {name} trained anything, so {pretrained} is not used zero-shot on it; "
    fine_tune = (f"fine-tune it there instead (`seqrec finetune {name} --from {pretrained}`), or take a run that "
                 "never saw it")
    if data.fingerprint == trained_on:
        raise SeqrecError(f"{pretrained} was trained on {name} (dataset fingerprint {data.fingerprint}): {zero}"
                          f"`seqrec evaluate {pretrained}` evaluates it on {name} as it was trained")
    if data.fingerprint in {d.get("fingerprint") for d in domains}:
        raise SeqrecError(f"{pretrained} was pre-trained on {name} (dataset fingerprint {data.fingerprint}): "
                          + zero + fine_tune)
    sketched = [d for d in domains if d.get("events_sketch")]
    ours = events_sketch(data) if sketched else []
    for domain in sketched:  # the same events prepared with other options (k-core, split, ...)
        share = contained(ours, domain["events_sketch"])
        if share is not None and share >= SEEN_SHARE:
            raise SeqrecError(f"{pretrained} has already learnt from most of {name}'s events: about {share:.0%} of "
                              f"them are its pre-training domain {domain['domain']}'s (prepared apart); " + zero
                              + fine_tune)


def zero_shot(pretrained: Path, data: PreparedDataset, cfg: RunConfig, run_dir: Path,
              device: torch.device) -> dict[str, Any]:
    """The pre-trained model moved to `data` through its item text alone, written as a run folder (config,
    checkpoint, results with validation and test metrics), so that evaluate, recommend, serve and export
    use it like any trained run."""
    from seqrec.data.io import write_json_atomic
    from seqrec.train.loop import final_results

    if cfg.data.max_len != pretrained_max_len(pretrained):
        raise SeqrecError(f"pre-trained with max_len={pretrained_max_len(pretrained)}; use data.max_len equal to it")
    check_unseen(pretrained, data)
    pretrained = Path(pretrained).resolve()  # the run folder records where its weights came from, from anywhere
    cfg.train.refit = False
    model = finetune_model(pretrained, data, cfg.model, cfg.data.max_len, trained=False).to(device).eval()
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "config.json", cfg.to_dict())
    save_checkpoint(model, run_dir / "checkpoint", max_len=cfg.data.max_len, item_table=data.item_table,
                    extra={"epoch": 0, "zero_shot": True, "pretrained": str(pretrained),
                           "dataset_fingerprint": data.fingerprint})
    results = final_results(model, model, data, cfg, device, 0, [], 0.0)
    results["protocol"]["model_selection"] = "none: zero-shot, no event of this dataset trained anything"
    results["pretrained"] = str(pretrained)
    write_json_atomic(run_dir / "results.json", results)
    return results
