"""What an exported encoder takes beside the item indices, and the manifest sections that say so (its
inputs and outputs, features, text; `seqrec.serve.export`): each event feature is an input of its own
(`event_<name>`, (B, L) float32 aligned with the items; NaN = missing, 0 at padding; item features travel
inside the encoder), and a text model's table of item input vectors grows with items added by text through
`adaptor.onnx`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from seqrec.errors import SeqrecError
from seqrec.models.base import SequentialModel

if TYPE_CHECKING:
    from seqrec.serve.export import EncoderForExport

TEXT_ITEMS = (
    "A text model takes new items by text without retraining: encode each new item's text with the text "
    "encoder named here (its settings, no normalisation), run adaptor.onnx on the vectors, append its "
    "item_inputs rows to item_inputs (the encoder's input) and its item_vectors rows to item_vectors; the new "
    "items take the next indices N+1, N+2, ... in items and in the scores. The encoder's precision is how "
    "the run computes text (auto: bfloat16 where the CPU has it); float32 gives the same vectors within 1e-3 "
    "cosine. Rows are appended, not replaced: when item_ids is true (a transductive model), a trained item's "
    "row also holds its ID vector, which adaptor.onnx does not give (seqrec's Recommender re-texts known items)."
)

EVENT_VOCAB_LIMIT = 4096  # keys of a categorical event feature the exported lookup compares a value with


def check_vocabularies(model: SequentialModel) -> None:
    """The exported graph looks an event value up by comparing it with every key of its vocabulary (ONNX
    has no searchsorted): (B, L, V) per call, refused above EVENT_VOCAB_LIMIT keys."""
    from seqrec.nn.features import CategoricalInput

    block = model.feature_block
    for name in model.event_feature_names():
        enc = block.encoders[name] if block is not None else None
        if isinstance(enc, CategoricalInput) and len(enc.keys) > EVENT_VOCAB_LIMIT:
            raise SeqrecError(f"event feature {name!r} has {len(enc.keys):,} values; the ONNX graph compares "
                              f"each with every one (at most {EVENT_VOCAB_LIMIT:,}): serve it with --engine torch")


def event_inputs(names: list[str]) -> list[str]:
    """The encoder's input name of each event feature."""
    return [f"event_{name}" for name in names]


def example_events(block: Any, name: str, items: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """(B, L) raw values of event feature `name` for the export's checks: a categorical feature's values
    from its training vocabulary (and one unseen value), a continuous one's around its training scale;
    one in five missing (NaN), padding 0."""
    from seqrec.nn.features import CategoricalInput

    enc = block.encoders[name]
    shape = tuple(items.shape)
    if isinstance(enc, CategoricalInput):
        keys = torch.cat([enc.keys.float(), torch.tensor([-12345.0])])
        values = keys[torch.randint(len(keys), shape, generator=g)]
    else:
        scale = torch.exp(enc.mean + enc.std) if enc.log1p else enc.mean.abs() + enc.std
        values = torch.rand(shape, generator=g) * 2 * scale
    values = torch.where(torch.rand(shape, generator=g) < 0.2, torch.nan, values)
    return torch.where(items > 0, values, torch.zeros(())).float()


EVENT_VALUES = {
    "gap": "seconds since the previous event of the history (before the window too); NaN for its first event",
    "hour": "floor((time mod 86400) / 3600): the event's UTC hour",
}


def features_section(model: SequentialModel) -> dict[str, Any]:
    """The side features: item ones live in the encoder; each event one is an input and says its value."""
    block = model.feature_block
    if block is None:
        return {"item": [], "event": []}
    fields = [f.spec for f in block.fitted]
    return {"item": [f.name for f in fields if f.level == "item"],
            "event": [{"name": f.name, "input": event_inputs([f.name])[0], "kind": f.kind,
                       "value": EVENT_VALUES.get(f.name, f"the event's {f.name!r} value, as in the training log")}
                      for f in fields if f.level == "event"]}


def interface(wrapper: EncoderForExport, d: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(inputs, outputs) of encoder.onnx: name, dtype, shape (symbolic dims by letter)."""
    inputs: list[dict[str, Any]] = [{"name": "items", "dtype": "int64", "shape": ["B", "L"],
                                     "doc": f"item indices, left-padded with 0, 1 <= L <= {wrapper.max_len}"}]
    if wrapper.takes_table:
        inputs.append({"name": "item_inputs", "dtype": "float32", "shape": ["N", d],
                       "doc": "every item's input vector (items.safetensors item_inputs, with the rows of items "
                              "added since: see text)"})
    for name, field in zip(event_inputs(wrapper.event_names), wrapper.event_names, strict=True):
        inputs.append({"name": name, "dtype": "float32", "shape": ["B", "L"],
                       "doc": f"event feature {field!r} of each position of items (see features), NaN = missing"})
    outputs = [{"name": "state", "dtype": "float32", "shape": ["B", d],
                "doc": "the state that predicts the next item"}]
    if wrapper.model.history is not None:
        outputs.append({"name": "history_offsets", "dtype": "float32", "shape": ["B", "L"],
                        "doc": "added to the score of the item at the same position of items"})
    return inputs, outputs


def text_section(model: SequentialModel, exporter: str) -> dict[str, Any]:
    """How a text model's export takes new items: the text encoder's settings and adaptor.onnx."""
    config: Any = model.config
    options, d, text_dim = config.text_options(), int(config.d), int(config.text_dim)
    return {
        "encoder": {"name": options.encoder, "revision": options.revision, "pooling": options.pooling,
                    "max_length": options.max_length, "template": options.template, "dim": text_dim,
                    "precision": options.precision,
                    "text": "a new item's text goes to the encoder as given; the trained items' texts were "
                            + (f"made by the template {options.template!r} from their fields" if options.template
                               else "their dataset's text field (what `data prepare --text-template` built), "
                                    "else their title, categories, brand and description joined by '. '")},
        "item_ids": bool(config.item_ids),  # transductive: trained items' rows hold an ID vector too
        "adaptor": {"file": "adaptor.onnx", "exporter": exporter,
                    "inputs": [{"name": "text", "dtype": "float32", "shape": ["n", text_dim],
                                "doc": "the new items' text vectors from the encoder above (not normalised)"}],
                    "outputs": [{"name": "item_inputs", "dtype": "float32", "shape": ["n", d],
                                 "doc": "rows to append to item_inputs"},
                                {"name": "item_vectors", "dtype": "float32", "shape": ["n", d],
                                 "doc": "rows to append to item_vectors"}]},
        "adding_items": TEXT_ITEMS,
    }


def example_items(n_items: int, batch: int, width: int, seed: int = 0) -> torch.Tensor:
    """(batch, width) left-padded rows of valid item indices, of assorted lengths (row 0 full)."""
    g = torch.Generator().manual_seed(seed)
    items = torch.randint(1, n_items + 1, (batch, width), generator=g)
    lengths = torch.randint(1, width + 1, (batch,), generator=g)
    lengths[0] = width
    return items * (torch.arange(width)[None, :] >= width - lengths[:, None])
