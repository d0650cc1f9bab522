"""UniSRec multi-domain pre-training (Hou et al., KDD 2022, Sec. 3.3).

Domains keep their own item ids: domain k's item i becomes the global item
offset_k + i of one joint catalogue whose text buffer is the domains' text
vectors stacked, so the only thing shared across domains is text. Batches are
drawn from the joint sequences, so every batch mixes domains.

    L = L_seq-item + λ L_seq-seq
    L_seq-item  next item vs the other items of the batch (or a MoCo queue); same-item negatives masked
    L_seq-seq   a sequence vs its own augmented view (items dropped, words of the item text dropped)

A run folder holds config.json, data_card.json (domains, counts, encoder, recipe),
metrics.jsonl (loss, throughput, peak memory), results.json and checkpoint/ (a UniSRec over the joint catalogue; `seqrec
finetune` moves it to a new domain).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from seqrec.data.batching import Batch, TrainBatches, ragged_index
from seqrec.data.dataset import PreparedDataset
from seqrec.data.io import write_json_atomic
from seqrec.data.sketch import events_sketch
from seqrec.data.text import text_embeddings
from seqrec.errors import SeqrecError
from seqrec.models.unisrec import UniSRec, UniSRecConfig
from seqrec.nn.contrastive import KeyQueue, info_nce_in_batch, info_nce_items, info_nce_queue, momentum_update
from seqrec.train.checkpoint import save_checkpoint
from seqrec.train.loop import peak_rss_mb, seed_everything

log = logging.getLogger(__name__)


@dataclass
class PretrainConfig:
    datasets: list[str] = field(default_factory=list)  # prepared-dataset folders
    negatives: Literal["in-batch", "moco"] = "in-batch"
    lam: float = 1e-3  # weight of the sequence-sequence loss
    item_drop: float = 0.2  # item-drop rate of the augmented view
    positions: Literal["all", "last"] = "all"  # which positions predict their next item
    queue_size: int = 4096  # MoCo: queued keys per queue (items, sequences)
    momentum: float = 0.999  # MoCo: momentum of the key encoder
    max_len: int = 50
    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0
    clip_grad: float = 5.0
    max_steps: int = 0  # stop after this many steps; 0 = no limit
    time_budget_s: float = 0.0  # stop after this much training time; 0 = no limit
    seed: int = 42
    threads: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.lam < 0 or not 0 <= self.item_drop < 1 or not 0 <= self.momentum < 1:
            raise SeqrecError("pretrain: lam >= 0, item_drop in [0, 1) and momentum in [0, 1) are required")
        if self.batch_size < 2 or self.queue_size < 1 or self.epochs < 1:
            raise SeqrecError("pretrain: batch_size >= 2, queue_size >= 1 and epochs >= 1 are required")


@dataclass
class Domains:
    """Several prepared datasets as one joint catalogue (item ids shifted by each domain's offset)."""

    data: PreparedDataset  # joint sequences (an in-memory view; its path is the first domain's)
    text: torch.Tensor  # (N+1, D_text)
    text_word_drop: torch.Tensor  # (N+1, D_text)
    items: pl.DataFrame  # idx, item ("domain:raw id"), domain, title
    offsets: dict[str, int]


def join_domains(datasets: list[PreparedDataset], model: UniSRecConfig, progress: bool = False) -> Domains:
    if not datasets:
        raise SeqrecError("pretrain needs at least one dataset")
    if model.text_word_drop <= 0:  # checked before any text is encoded
        raise SeqrecError("pre-training needs the word-drop view: set model.text_word_drop > 0")
    seqs, user_offsets, splits, tables = [], [np.zeros(1, dtype=np.int64)], [], []
    offsets: dict[str, int] = {}
    texts, augs = [torch.zeros(1, model.text_dim)], [torch.zeros(1, model.text_dim)]
    shift, events = 0, 0
    for data in datasets:
        try:
            te = text_embeddings(data, model.text_options(), progress=progress)
        except SeqrecError as exc:  # several domains: say whose items
            raise SeqrecError(f"pre-training domain {data.meta['name']}: {exc}") from None
        assert te.emb_word_drop is not None  # word_drop > 0
        name = str(data.meta["name"])
        name = name if name not in offsets else f"{name}#{len(offsets) + 1}"
        offsets[name] = shift
        # each user's training events only (`train_end`: a time split's cutoff too), users without any left out
        end = data.train_end()
        keep = np.flatnonzero(end > 0)
        lengths = end[keep]
        seqs.append(data.items[ragged_index(data.offsets[:-1][keep], lengths)].astype(np.int64) + shift)
        user_offsets.append(np.cumsum(lengths) + events)
        splits.append(np.full((len(keep), 2), -1, dtype=np.int64))
        # model.text_centre: each domain less its own mean (the model's text_mean stays zero here)
        mean = te.emb[1:].mean(0) if model.text_centre else torch.zeros(model.text_dim)
        texts.append(te.emb[1:] - mean)
        augs.append(te.emb_word_drop[1:] - mean)
        t = data.item_table.sort("idx")
        title = next((t[c].cast(pl.Utf8) for c in ("title", "text") if c in t.columns), None)
        tables.append(pl.DataFrame({"idx": t["idx"] + shift, "item": [f"{name}:{i}" for i in t["item"]],
                                    "domain": [name] * t.height, "title": title}))
        shift, events = shift + data.n_items, events + int(lengths.sum())
    joint_offsets = np.concatenate(user_offsets)
    meta = {"name": "+".join(offsets), "n_items": shift, "n_users": len(joint_offsets) - 1,
            "fingerprint": "+".join(d.fingerprint for d in datasets), "options": {"split": "joint"}}
    joint = PreparedDataset(datasets[0].path, meta, np.concatenate(seqs), joint_offsets, np.concatenate(splits), None)
    return Domains(joint, torch.cat(texts), torch.cat(augs), pl.concat(tables, how="diagonal_relaxed"), offsets)


def drop_items(items: torch.Tensor, p: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, L) left-padded -> the same rows with each item dropped with probability p, left-padded again.
    A row that would lose every item is kept whole."""
    real = items != 0
    keep = real & (torch.rand(items.shape, generator=generator) >= p)
    keep = torch.where(keep.any(1, keepdim=True), keep, real)
    order = torch.argsort(keep.int(), dim=1, stable=True)  # dropped slots first: re-left-pad
    return (items * keep).gather(1, order)


def with_queue(keys: torch.Tensor, ids: torch.Tensor, queue: KeyQueue) -> tuple[torch.Tensor, ...]:
    """(negatives, their ids, their validity): the batch's own keys followed by the queued ones."""
    valid = torch.ones_like(ids, dtype=torch.bool)
    return torch.cat([keys, queue.keys]), torch.cat([ids, queue.ids]), torch.cat([valid, queue.valid])


class Pretrainer:
    """One optimisation step of the two InfoNCE losses, with in-batch or MoCo negatives."""

    def __init__(self, model: UniSRec, cfg: PretrainConfig, text_word_drop: torch.Tensor) -> None:
        self.model, self.cfg, self.aug = model, cfg, text_word_drop
        self.tau = model.config.temperature
        self.key_model: UniSRec | None = None
        if model.history is not None and cfg.negatives == "moco":
            raise SeqrecError("pretrain: model.history_bias = true learns with in-batch negatives only "
                              "(set pretrain.negatives = \"in-batch\" or model.history_bias = false)")
        if cfg.negatives == "moco":
            self.key_model = copy.deepcopy(model).requires_grad_(False)
            self.item_queue = KeyQueue(cfg.queue_size, model.config.d)
            self.seq_queue = KeyQueue(cfg.queue_size, model.config.d)

    def positives(self, batch: Batch, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(M, D) states that predict a next item and (M,) those items."""
        assert batch.targets is not None
        if self.cfg.positions == "last":
            return h[:, -1], batch.targets[:, -1]
        keep = batch.targets != 0
        return h[keep], batch.targets[keep]

    def history_rows(self, batch: Batch, h: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """With `model.history_bias = true`: each positive's history items, their offsets and their
        logits (seqrec.nn.history), so that the one offset shared by every domain learns whether users
        come back to an item, and a zero-shot target starts from what it learnt."""
        history = self.model.history
        if history is None:
            return None
        assert batch.targets is not None
        keep = batch.targets != 0
        if self.cfg.positions == "last":
            keep = torch.zeros_like(keep)
            keep[:, -1] = True
        vecs = F.normalize(self.model.embed_items(batch.items), dim=-1)  # (B, L, D); padding stays 0
        return history.training_rows(F.normalize(h, dim=-1), batch.items, None, None, keep, item_vecs=vecs)

    def losses(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        model = self.model
        h = model.hidden(batch.items)  # (B, L, D)
        q_item, target = self.positives(batch, h)
        q_item = F.normalize(q_item, dim=-1)
        q_seq = F.normalize(h[:, -1], dim=-1)
        view = drop_items(batch.items, self.cfg.item_drop)
        if self.key_model is None:  # one key per distinct item: long histories repeat few items many times
            items, column = torch.unique(target, return_inverse=True)
            k_item = F.normalize(model.embed_items(items), dim=-1)
            k_seq = F.normalize(model.hidden(view, text=self.aug)[:, -1], dim=-1)
            return (info_nce_items(q_item, k_item, items, column, self.tau, history=self.history_rows(batch, h)),
                    info_nce_in_batch(q_seq, k_seq, self.tau))
        with torch.no_grad():
            k_item = F.normalize(self.key_model.embed_items(target), dim=-1)
            k_seq = F.normalize(self.key_model.hidden(view, text=self.aug)[:, -1], dim=-1)
        # negatives: this batch's keys, then the queue (a row's own key is masked as the same item)
        iq, sq = self.item_queue, self.seq_queue
        row_ids = -2 - torch.arange(len(k_seq))  # distinct from each other and from the queue's -1
        neg, neg_ids, neg_valid = with_queue(k_item, target, iq)
        si = info_nce_queue(q_item, k_item, neg, self.tau, target, neg_ids, neg_valid)
        neg, neg_ids, neg_valid = with_queue(k_seq, row_ids, sq)
        ss = info_nce_queue(q_seq, k_seq, neg, self.tau, row_ids, neg_ids, neg_valid)
        iq.enqueue(k_item, target)
        sq.enqueue(k_seq)
        return si, ss

    def after_step(self) -> None:
        if self.key_model is not None:
            momentum_update(self.model, self.key_model, self.cfg.momentum)


def data_card(datasets: list[PreparedDataset], domains: Domains, model_cfg: UniSRecConfig, cfg: PretrainConfig,
              recipe: str | None) -> dict[str, Any]:
    """What the pre-trained model learnt from: each domain's counts and fingerprint, the text encoder
    and the recipe. Written as `data_card.json` in the run folder."""
    rows = []
    for data, (name, offset) in zip(datasets, domains.offsets.items(), strict=True):
        train_events = int(data.train_end().sum())
        rows.append({"domain": name, "path": str(data.path), "fingerprint": data.fingerprint,
                     "users": data.n_users, "items": data.n_items, "interactions": len(data.items),
                     "training_events": train_events, "item_offset": offset,
                     "events_sketch": events_sketch(data)})  # (a zero-shot refuses these events re-prepared)
    text = model_cfg.text_options()
    return {"domains": rows, "users": sum(r["users"] for r in rows), "items": sum(r["items"] for r in rows),
            "training_events": sum(r["training_events"] for r in rows),
            "uses": "every user's training events (validation and test targets are held out)",
            "text_encoder": {"encoder": text.encoder, "pooling": text.pooling, "max_length": text.max_length,
                             "template": text.template, "missing": text.missing, "dim": model_cfg.text_dim},
            "recipe": recipe, "pretrain": dataclasses.asdict(cfg)}


def pretrain(cfg: PretrainConfig, model_cfg: UniSRecConfig, run_dir: Path, recipe: str | None = None
             ) -> dict[str, Any]:
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    datasets = [PreparedDataset.load(Path(p)) for p in cfg.datasets]
    domains = join_domains(datasets, model_cfg, cfg.progress)
    model = UniSRec(model_cfg, domains.data.n_items, cfg.max_len, domains.text)
    if model_cfg.whitening_init or model_cfg.adaptor == "whitening":
        model.adaptor.init_whitening(domains.text[1:], torch.Generator().manual_seed(cfg.seed))  # type: ignore[operator]
    trainer = Pretrainer(model, cfg, domains.text_word_drop)
    # the run folder only once the inputs have proved usable: a refused run leaves nothing behind
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "config.json", {"pretrain": dataclasses.asdict(cfg),
                                                 "model": dataclasses.asdict(model_cfg)})
    write_json_atomic(run_dir / "data_card.json", data_card(datasets, domains, model_cfg, cfg, recipe))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay)
    batches = TrainBatches(domains.data, cfg.max_len, cfg.batch_size, cfg.seed)
    history = train_epochs(trainer, opt, batches, cfg, run_dir)
    save_checkpoint(model, run_dir / "checkpoint", max_len=cfg.max_len, item_table=domains.items,
                    extra={"pretrain": dataclasses.asdict(cfg), "domains": domains.offsets})
    last = history[-1] if history else {}
    results = {"datasets": cfg.datasets, "domains": domains.offsets, "negatives": cfg.negatives,
               "steps": sum(r["steps"] for r in history), "epochs_run": len(history),
               "train_seconds": sum(r["train_s"] for r in history),
               "sequences_per_s": last.get("sequences_per_s"), "targets_per_s": last.get("targets_per_s"),
               "final_loss": last.get("loss"), "peak_rss_mb": peak_rss_mb(),
               "n_parameters": sum(p.numel() for p in model.parameters())}
    write_json_atomic(run_dir / "results.json", results)
    return results


PROGRESS_S = 60.0  # seconds between the log lines of an epoch


def train_epochs(trainer: Pretrainer, opt: torch.optim.Optimizer, batches: TrainBatches, cfg: PretrainConfig,
                 run_dir: Path) -> list[dict[str, Any]]:
    model, history, steps, start = trainer.model, [], 0, time.perf_counter()
    said = start
    (run_dir / "metrics.jsonl").write_text("")
    for epoch in range(1, cfg.epochs + 1):
        model.train()
        sums, n, seqs, targets, t0 = np.zeros(2), 0, 0, 0, time.perf_counter()
        for batch in tqdm(batches, desc=f"pretrain {epoch}", disable=None if cfg.progress else True, leave=False):
            if n and time.perf_counter() - said > PROGRESS_S:  # a line now and then, where no bar shows (a log)
                said = time.perf_counter()
                log.info("pretrain epoch %d: %d steps, loss %.4f so far, %.0f s", epoch, n,
                         (sums[0] + cfg.lam * sums[1]) / n, said - start)
            si, ss = trainer.losses(batch)
            loss = si + cfg.lam * ss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.clip_grad > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
            opt.step()
            trainer.after_step()
            sums += (si.item(), ss.item())
            n, steps = n + 1, steps + 1
            seqs += len(batch.items)
            targets += int((batch.targets != 0).sum()) if batch.targets is not None else 0
            over = cfg.time_budget_s and time.perf_counter() - start > cfg.time_budget_s
            if (cfg.max_steps and steps >= cfg.max_steps) or over:
                break
        secs = time.perf_counter() - t0
        row = {"epoch": epoch, "steps": n, "loss": float((sums[0] + cfg.lam * sums[1]) / max(1, n)),
               "loss_seq_item": float(sums[0] / max(1, n)), "loss_seq_seq": float(sums[1] / max(1, n)),
               "train_s": secs, "sequences_per_s": seqs / max(secs, 1e-9), "targets_per_s": targets / max(secs, 1e-9),
               "peak_rss_mb": peak_rss_mb()}
        history.append(row)
        with (run_dir / "metrics.jsonl").open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        log.info("pretrain epoch %d: loss %.4f (seq-item %.4f, seq-seq %.4f), %.0f sequences/s", epoch,
                 row["loss"], row["loss_seq_item"], row["loss_seq_seq"], row["sequences_per_s"])
        if cfg.max_steps and steps >= cfg.max_steps:
            log.info("pretrain.max_steps = %d reached", cfg.max_steps)
            break
        if cfg.time_budget_s and time.perf_counter() - start > cfg.time_budget_s:
            log.info("time budget of %.0f s reached (pretrain.time_budget_s) after %d steps", cfg.time_budget_s, steps)
            break
    return history
