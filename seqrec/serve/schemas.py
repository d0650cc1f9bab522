"""The typed requests and responses of the HTTP service (`seqrec.serve.app`): what the OpenAPI schema
publishes and every request is validated against."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def _integer_id(value: Any) -> Any:
    """A JSON integer given as an item id (MovieLens's ids look like numbers) is its decimal string."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


ItemId = Annotated[str, BeforeValidator(_integer_id),
                   Field(min_length=1, max_length=256, description="a raw item id (a JSON integer is taken as its "
                         "decimal string)")]


# no coercion where a client's mistake would pass as another value: `true` is not k = 1, "yes" is not a
# boolean, and NaN / Infinity (not JSON, though Python's parser takes them) are no time or rating
K = Annotated[int, Field(ge=1, le=1000, strict=True)]
Flag = Annotated[bool, Field(strict=True)]
Finite = Annotated[float, Field(allow_inf_nan=False)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RecommendRequest(Strict):
    history: list[ItemId] = Field(min_length=1, max_length=10_000, description="raw item ids, oldest first")
    k: K = 10
    exclude_seen: Flag = False
    times: list[Finite] | None = Field(None, max_length=10_000, description="seconds, one per history item: "
                                      "used by a model with time features (gap, hour), checked and not used by others")
    events: dict[Annotated[str, Field(max_length=200)], Annotated[list[Finite], Field(max_length=10_000)]] | None = (
        Field(None, max_length=64, description="event feature values by name (e.g. rating), one per history item"))
    unknown: Literal["error", "skip"] = Field("error", description=(
        "an id the catalogue does not hold: a 404 (error), or left out of the history (and candidates) and "
        "listed in the answer's skipped (skip: for clients whose histories hold items a run trained again left "
        "out)"))
    candidates: list[ItemId] | None = Field(None, min_length=1, max_length=100_000, description=(
        "rank only these raw item ids (e.g. what is in stock), exactly; removed ones, and seen ones with "
        "exclude_seen, are left out"))


class BatchRequest(Strict):
    histories: list[Annotated[list[ItemId], Field(min_length=1, max_length=10_000)]] = Field(
        min_length=1, max_length=1000)
    k: K = 10
    exclude_seen: Flag = False
    unknown: Literal["error", "skip"] = Field("error", description="as in /recommend, for each history")


class Item(BaseModel):
    item: str
    score: float
    title: str | None = None


class SimilarResponse(BaseModel):
    items: list[Item]


class RecommendResponse(SimilarResponse):
    skipped: list[str] = Field(default_factory=list, description="history ids left out as unknown (unknown: skip)")


class BatchResponse(BaseModel):
    results: list[list[Item]]
    skipped: list[list[str]] = Field(default_factory=list, description="per history, the ids left out as unknown "
                                     "(unknown: skip; empty lists otherwise)")
    errors: list[str | None] = Field(default_factory=list, description="per history, null, or why it has no "
                                     "results (unknown: skip, and none of its ids known)")


class NewItem(Strict):
    id: ItemId
    text: str = Field(min_length=1, max_length=20_000, description="the item's text (title, brand, ...)")
    title: str | None = Field(None, min_length=1, max_length=2_000, description="the title shown with the item "
                              "(recommendations, GET /items); its text when left out")


class ItemsRequest(Strict):
    items: list[NewItem] = Field(min_length=1, max_length=10_000)


class RemoveRequest(Strict):
    ids: list[ItemId] = Field(min_length=1, max_length=100_000)


# the catalogue's two counts, named alike in every answer that gives them
N_ITEMS = Field(description="items the catalogue knows (usable in histories), removed ones included")
N_ACTIVE = Field(description="items recommendable now: the known ones less the removed ones")


class RemoveResponse(BaseModel):
    removed: list[str]  # the ids given, none of them recommendable now
    n_items: int = N_ITEMS
    n_active: int = N_ACTIVE


class ItemsResponse(BaseModel):
    added: list[str]
    replaced: list[str]
    n_items: int = N_ITEMS
    n_active: int = N_ACTIVE


class ItemInfo(BaseModel):
    item: str
    title: str | None
    recommendable: bool


class EventRequest(Strict):
    item: ItemId
    k: K = 10
    exclude_seen: Flag = False
    time: Finite | None = Field(None, description="the event's time, seconds (for gap and hour features)")
    values: dict[Annotated[str, Field(max_length=200)], Finite] | None = Field(
        None, max_length=64, description="the event's feature values by name (e.g. rating)")


class SessionResponse(BaseModel):
    session_id: str
    n_events: int
    items: list[str]
    recommendations: list[Item]
    cached: bool


class Health(BaseModel):
    status: str
    model: str
    n_items: int = N_ITEMS
    n_active: int = N_ACTIVE
    index: str
    index_rebuilding: bool  # a FAISS index being rebuilt in the background (after heavy changes)
    sessions: int
    takes_text: bool
    catalogue_changes: int | None = None  # changes ever made to the catalogue log, as far as this process has read it
    catalogue_log_error: str | None = None  # why this process stopped keeping the catalogue log ("degraded")
    run: str | None = None  # the run folder served (a link resolved: which run a deploy switched it to)
    version: str | None = None  # the checkpoint served (the start of its model.json's sha256)
    pid: int  # the worker process that answered
    writes_need_token: bool = False  # catalogue changes need the service's write token (a bearer token)
