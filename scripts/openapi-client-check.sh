#!/usr/bin/env bash
# Generates a Python client from the document a running `socialgate demo`
# serves (openapi-python-client, no hand edits) into target/, then calls every
# endpoint with it and follows `next_cursor` to the end of each listing.
# Needs `cargo build --workspace` first; installs the generator (pinned) in
# the same venv as .ci/schemathesis.sh. Not part of CI (it takes a minute).
set -euo pipefail
cd "$(dirname "$0")/.."

GENERATOR_VERSION=0.29.1
VENV=target/ci-venv
WORK=target/openapi-client

. scripts/demo-server.sh
venv_tool "$VENV" openapi-python-client openapi-python-client "$GENERATOR_VERSION"
rm -rf "$WORK" && mkdir -p "$WORK"
start_demo "$WORK"
base=$DEMO_BASE
key=$DEMO_KEY

(cd "$WORK" && "../../$VENV/bin/openapi-python-client" generate --url "$base/v1/openapi.json" --meta none --output-path client >generate.log)
PYTHONPATH="$WORK" "$VENV/bin/python" - "$base" "$key" <<'PY'
import sys
from client import AuthenticatedClient
from client.api.shortvideo import get_profile, list_posts, get_post, list_comments, search_profiles
from client.api.service import get_health, get_readiness, get_open_api_document
from client.types import UNSET

base, key = sys.argv[1], sys.argv[2]
api = AuthenticatedClient(base_url=base, token=key, prefix="", auth_header_name="X-API-Key")

assert get_health.sync(client=api).status == "ok"
assert get_readiness.sync(client=api).status == "ready"
assert get_open_api_document.sync_detailed(client=api).status_code == 200

profile = get_profile.sync(client=api, username="lunabakes")
print("profile:", profile.data.username, profile.data.followers)

def follow(call, **args):
    pages, items, cursor = 0, 0, UNSET
    while True:
        page = call(client=api, cursor=cursor, **args)
        pages, items = pages + 1, items + len(page.data)
        if not page.meta.next_cursor:
            return pages, items
        cursor = page.meta.next_cursor

pages, posts = follow(list_posts.sync, username="lunabakes", count=5)
print(f"posts: {posts} in {pages} pages")
first = list_posts.sync(client=api, username="lunabakes").data[0]
post = get_post.sync(client=api, id=first.id)
print("post:", post.data.id, post.data.likes)
pages, comments = follow(list_comments.sync, id=post.data.id, count=50)
print(f"comments: {comments} in {pages} pages")
pages, found = follow(search_profiles.sync, query="luna", count=2)
print(f"search: {found} in {pages} pages")

missing = get_profile.sync_detailed(client=api, username="nobody_here")
assert missing.status_code == 404 and missing.parsed.error.code.value == "RESOURCE_NOT_FOUND", missing
bad = list_posts.sync_detailed(client=api, username="lunabakes", count=0)
assert bad.status_code == 400 and bad.parsed.error.param == "count", bad
print("ok: every endpoint called, every listing followed to its end")
PY
