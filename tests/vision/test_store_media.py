"""Images go to the store's blob store by reference: the record holds URLs only, a lost blob is named."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from arborl.env.envs.frozenlake_image import render_lake
from arborl.rollout import run_episodes
from arborl.rollout.media import (
    canonical_image,
    decode_png,
    encode_png,
    expand_markers,
    image_inputs,
    split_images,
)
from arborl.store import open_store
from arborl.store.base import StoreError
from arborl.train.batch import collate

from .conftest import gen, lake, rollout_config, specs


@pytest.fixture
def stored(tmp_path, policy):
    store = open_store(f"sqlite:///{tmp_path}/traj.db")
    eps = run_episodes(policy, lambda: lake("every"), specs(3), rollout_config(3), generator=gen(), media=store)
    ids = store.put_many(eps)
    yield store, store.get_many(ids), eps
    store.close()


def test_images_round_trip_through_the_store_by_reference(stored, tmp_path):
    store, back, eps = stored
    env = lake("every")
    for ep in back:
        env.reset(seed=ep.seed)
        first = ep.turns[0].media[0]
        assert first.url.startswith("file://") and first.mime == "image/png"
        # the turn-1 picture, bit for bit, addressed by its content
        want = render_lake(env._last_obs.rows, 4)
        assert np.array_equal(decode_png(store.get_media(first)), want)
        assert first.sha256 == hashlib.sha256(encode_png(want)).hexdigest()
    assert [[t.media for t in e.turns] for e in back] == [[t.media for t in e.turns] for e in eps]
    # content addressing: the same picture shown again is one blob
    urls = {m.url for e in back for t in e.turns for m in t.media}
    blobs = [p for p in Path(f"{tmp_path}/traj.db.blobs").rglob("*") if p.is_file()]
    assert len(urls) < sum(len(t.media) for e in back for t in e.turns)
    assert {p.name for p in blobs} >= {u.rsplit("/", 1)[1] for u in urls}


def test_the_episode_record_holds_no_pixel_data(stored, tmp_path):
    _, back, _ = stored
    for ep in back:
        text = ep.to_json()
        assert "PNG" not in text and "\\u0089" not in text
        assert sum(len(t.media) for t in ep.turns) == len(ep.turns)  # one picture per turn, each a URL
        media = [m for t in ep.to_dict()["turns"] for m in t["media"]]
        assert all(set(m) == {"url", "mime", "sha256"} and len(m["url"]) < 200 for m in media)
    index = Path(f"{tmp_path}/traj.db").read_bytes()
    assert b"\x89PNG" not in index


def test_a_missing_blob_is_an_error_naming_its_url(stored, vision_model, renderer):
    store, back, _ = stored
    lost = back[1].turns[0].media[0]
    Path(lost.url.removeprefix("file://")).unlink()
    with pytest.raises(StoreError, match=lost.url.replace(".", r"\.")):
        collate(back, pad_id=renderer.tokenizer.pad_token_id, images=image_inputs(vision_model, store))


def test_a_corrupt_blob_is_refused_by_its_hash(stored, vision_model, renderer):
    store, back, _ = stored
    ref = back[0].turns[0].media[0]
    Path(ref.url.removeprefix("file://")).write_bytes(encode_png(np.zeros((16, 16, 3), np.uint8)))
    with pytest.raises(StoreError, match="sha256"):
        collate(back[:1], pad_id=renderer.tokenizer.pad_token_id, images=image_inputs(vision_model, store))


def test_numpy_and_pil_images_become_the_same_canonical_pixels():
    rgb = np.arange(16 * 16 * 3, dtype=np.uint8).reshape(16, 16, 3)
    assert np.array_equal(canonical_image(Image.fromarray(rgb)), rgb)
    assert np.array_equal(canonical_image(np.dstack([rgb, np.full((16, 16), 7, np.uint8)])), rgb)  # alpha dropped
    assert np.array_equal(canonical_image(rgb.astype(np.float32) / 255.0), rgb)
    assert canonical_image(rgb[:, :, 0]).shape == (16, 16, 3)
    assert np.array_equal(decode_png(encode_png(rgb)), rgb)
    with pytest.raises(ValueError, match="shape"):
        canonical_image(np.zeros((2, 2, 2)))


def test_split_images_leaves_markers_in_order_and_expand_widens_them():
    a, b = np.zeros((4, 4, 3), np.uint8), np.ones((4, 4, 3), np.uint8)
    shown, images = split_images([{"role": "user", "content": [{"type": "image", "image": a},
                                                               {"type": "text", "text": "and"},
                                                               {"type": "image", "image": b}]}])
    assert shown == [{"role": "user", "content": "<image> and <image>"}]
    assert [int(im.max()) for im in images] == [0, 1]
    assert split_images("text only") == ("text only", [])
    assert expand_markers([5, 9, 6, 9], 9, [3, 2]) == [5, 9, 9, 9, 6, 9, 9]
    with pytest.raises(ValueError, match="2 images"):
        expand_markers([5, 9], 9, [3, 3])


def test_training_pixels_equal_the_rollouts(stored, vision_model, renderer):
    store, back, eps = stored
    live = collate(eps, pad_id=0, images=image_inputs(vision_model, store))
    again = collate(back, pad_id=0, images=image_inputs(vision_model, store))
    assert torch.equal(live.pixel_values, again.pixel_values) and torch.equal(live.image_row, again.image_row)
    sub = again.select(torch.tensor([2, 0]))
    assert torch.equal(sub.image_row, torch.tensor([0] * 3 + [1] * 3))
    assert torch.equal(sub.pixel_values, torch.cat([again.pixel_values[6:9], again.pixel_values[0:3]]))


def test_images_go_to_an_s3_blob_store_when_the_store_has_one(tmp_path, monkeypatch, policy, vision_model, renderer):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))
    from store_services import moto_server  # the S3 emulator the store tests use (scripts/setup/store.sh)

    for k, v in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                 ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(k, v)
    with moto_server() as endpoint:
        store = open_store(f"sqlite:///{tmp_path}/s3.db?blob=s3://imgs/run&s3_endpoint={endpoint}")
        eps = run_episodes(policy, lambda: lake("first"), specs(2), rollout_config(3), generator=gen(), media=store)
        back = store.get_many(store.put_many(eps))
        refs = [m for e in back for t in e.turns for m in t.media]
        assert refs and all(r.url.startswith("s3://imgs/run/sha256/") for r in refs)
        live = collate(eps, pad_id=0, images=image_inputs(vision_model, store))
        again = collate(back, pad_id=0, images=image_inputs(vision_model, store))
        assert torch.equal(live.pixel_values, again.pixel_values)
        store.blobs.delete(refs[-1].url)
        with pytest.raises(StoreError, match=refs[-1].url):
            collate(back, pad_id=0, images=image_inputs(vision_model, store))
        store.close()
