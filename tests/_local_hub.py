"""A loopback fake of the Hugging Face Hub HTTP API, so tests can exercise real Hub pushes offline.

The real clients (``huggingface_hub``, ``datasets``, ``transformers``) talk to :class:`LocalHub` exactly as they talk
to huggingface.co once ``HF_ENDPOINT`` points at it (use :func:`hub_env`, which also patches the values those
libraries read from the environment at import time). Only the standard library is used: an
``http.server.ThreadingHTTPServer`` on 127.0.0.1 in a background thread, repositories held in memory.

What it implements (the routes the installed clients call for the flows below):

- ``GET /api/whoami-v2``: a fake user, for the token :data:`FAKE_TOKEN` (any other token is rejected with 401).
- ``POST /api/repos/create``, ``DELETE /api/repos/delete``, ``PUT /api/{type}s/{id}/settings`` (``private``).
- ``GET /api/{type}s/{id}[/revision/{rev}]``: repo info (``sha``, ``private``, ``siblings``; sizes with ``blobs``).
- ``GET /api/{type}s/{id}/tree/{rev}[/{path}]`` (``recursive``, ``expand``), ``POST .../paths-info/{rev}``,
  ``GET .../refs``, ``GET .../commits/{rev}``, ``POST|DELETE .../branch/{name}``, ``POST .../tag/{rev}``.
- Uploads: ``POST .../preupload/{rev}`` (decides "regular" vs "lfs"), the git-LFS batch API
  ``POST /{prefix}{id}.git/info/lfs/objects/batch`` whose upload action is a ``PUT`` back to this server (plus its
  ``verify`` action), and ``POST .../commit/{rev}`` (ndjson: ``header``, ``file`` (base64), ``lfsFile``,
  ``deletedFile``, ``deletedFolder``; ``create_pr=1`` opens ``refs/pr/N``). ``POST /api/validate-yaml`` accepts all.
- Downloads: ``HEAD``/``GET /{prefix}{id}/resolve/{rev}/{path}`` with ``ETag``, ``X-Repo-Commit``,
  ``Content-Length``, ``X-Linked-Etag``/``X-Linked-Size`` for LFS files, and ``Range`` requests (206).

Errors carry the ``X-Error-Code`` header (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``) that
``huggingface_hub`` maps to its exception classes. A route this fake does not know answers 404 with a JSON error
and is recorded in :attr:`LocalHub.unhandled` (every request is in :attr:`LocalHub.requests_log`; a request a
handler crashes on answers 400 and leaves its traceback in :attr:`LocalHub.errors`), so a client flow that needs
something new fails with a readable message instead of a mystery.

Simplifications: repo ids must be ``namespace/name``; a file goes through LFS when it is 10 MiB or larger or when
its name matches a ``filter=lfs`` pattern of the repo's ``.gitattributes`` (created with the Hub's default one);
no Xet (``hf_xet`` must be off: ``HF_HUB_DISABLE_XET=1``), no multipart LFS, no pagination (one page), no gating,
no Spaces runtime, no discussions beyond the ``refs/pr/N`` branch a ``create_pr`` commit makes.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import hashlib
import importlib.util
import itertools
import json
import os
import threading
import time
import traceback
import urllib.parse
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self

FAKE_TOKEN = "hf_fake"
FAKE_USER = "fake-user"

# A file this large (or larger) is stored through LFS whatever its name, as on the Hub.
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024

# The .gitattributes the Hub puts in every new repo (its LFS patterns decide "lfs" vs "regular" uploads).
DEFAULT_GITATTRIBUTES = "".join(
    f"{pattern} filter=lfs diff=lfs merge=lfs -text\n"
    for pattern in [
        "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib", "*.lfs.*", "*.mlmodel",
        "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot", "*.parquet", "*.pb", "*.pickle", "*.pkl", "*.pt",
        "*.pth", "*.rar", "*.safetensors", "saved_model/**/*", "*.tar.*", "*.tar", "*.tflite", "*.tgz", "*.wasm",
        "*.xz", "*.zip", "*.zst", "*tfevents*",
    ]
)

_REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
_URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}


def _now() -> str:
    """The Hub's date format: ``2024-01-31T12:00:00.000Z``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


class HubError(Exception):
    """An error answer: ``status``, a JSON ``{"error": message, **extra}`` body, ``X-Error-Code: code`` if given."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None,
                 extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers, self.extra = headers or {}, extra or {}


@dataclass
class _File:
    data: bytes
    sha256: str | None = None  # set for LFS files: the content is addressed by its sha256

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def pointer(self) -> bytes | None:
        return _lfs_pointer(self.sha256, self.size) if self.sha256 else None

    @property
    def git_oid(self) -> str:
        # git stores an LFS file as its pointer text, so the blob oid of an LFS file is the pointer's
        return _git_blob_oid(self.pointer or self.data)


@dataclass
class _Commit:
    oid: str
    parents: list[str]
    title: str
    message: str
    date: str
    files: dict[str, _File]


@dataclass
class _Repo:
    type: str
    id: str
    private: bool
    created_at: str = field(default_factory=_now)
    commits: dict[str, _Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)  # "main", "refs/pr/1", ... -> commit oid
    tags: dict[str, str] = field(default_factory=dict)
    prs: int = 0

    @property
    def url_path(self) -> str:
        return _URL_PREFIX[self.type] + self.id


class LocalHub:
    """An in-memory Hub served on ``http://127.0.0.1:PORT``.

    ``with LocalHub() as hub: url = hub.url`` (or ``url = hub.start()`` ... ``hub.stop()``). Point the clients at it
    with :func:`hub_env`. ``requests_log`` lists every ``(method, path)`` served (path without query string),
    ``unhandled`` the ``(method, path?query)`` of requests no route matched (answered 404), ``errors`` the
    tracebacks of requests a handler crashed on (answered 400).
    """

    def __init__(self, token: str = FAKE_TOKEN, user: str = FAKE_USER):
        self.token, self.user = token, user
        self.url: str | None = None
        self.repos: dict[tuple[str, str], _Repo] = {}
        self.lfs_objects: dict[str, bytes] = {}  # sha256 -> content, filled by the LFS upload action
        self.requests_log: list[tuple[str, str]] = []
        self.unhandled: list[tuple[str, str]] = []
        self.errors: list[str] = []  # tracebacks of requests that crashed a handler (answered 400)
        self._lock = threading.RLock()
        self._counter = itertools.count()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> str:
        """Serve in a background thread; returns the base URL ``http://127.0.0.1:PORT``."""
        if self._server is None:
            handler = type("_BoundHandler", (_Handler,), {"hub": self})
            self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
            self._server.daemon_threads = True
            self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
            self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="LocalHub",
                                            daemon=True)
            self._thread.start()
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- direct access for tests -----------------------------------------------------------------------------

    def files(self, repo_id: str, repo_type: str = "model", revision: str = "main") -> dict[str, bytes]:
        """The files of a repo at a revision, ``{path: content}`` (LFS files with their real content)."""
        with self._lock:
            repo = self._repo(repo_type, repo_id, authed=True)
            return {p: f.data for p, f in self._commit(repo, revision).files.items()}

    def is_lfs(self, repo_id: str, path: str, repo_type: str = "model", revision: str = "main") -> bool:
        with self._lock:
            repo = self._repo(repo_type, repo_id, authed=True)
            return self._commit(repo, revision).files[path].sha256 is not None

    # ---- request handling ------------------------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, headers, body: bytes) -> tuple[int, dict, bytes]:
        """Route one request; returns ``(status, headers, body)``. HEAD is routed as GET (the body is dropped)."""
        split = urllib.parse.urlsplit(raw_path)
        path, query = split.path, urllib.parse.parse_qs(split.query)
        self.requests_log.append((method, path))
        auth = headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else None
        try:
            if token is not None and token != self.token:
                raise HubError(401, "Invalid credentials in Authorization header")
            req = _Request(method, path, query, headers, body, authed=token is not None)
            with self._lock:
                result = self._route(req)
            if result is None:
                self.unhandled.append((method, raw_path))
                raise HubError(404, f"LocalHub: no route for {method} {path} (see LocalHub.unhandled)")
            status, extra_headers, payload = result
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            # A request this fake cannot make sense of (a bug here or a new client payload): 400, not 500, because
            # the client retries 5xx for a minute; the traceback goes to `errors`.
            self.errors.append(f"{method} {raw_path}\n{traceback.format_exc()}")
            return 400, {"Content-Type": "application/json"}, json.dumps(
                {"error": f"LocalHub failed on {method} {path}: {type(e).__name__}: {e} (see LocalHub.errors)"}
            ).encode()
        except HubError as e:
            status, payload = e.status, json.dumps({"error": e.message, **e.extra}).encode()
            extra_headers = {"Content-Type": "application/json", **e.headers,
                             "X-Error-Message": e.message.encode("ascii", "replace").decode().replace("\n", " ")}
            if e.code:
                extra_headers["X-Error-Code"] = e.code
        return status, extra_headers, payload

    def _route(self, req: _Request):
        seg = [urllib.parse.unquote(s) for s in req.path.strip("/").split("/")]
        m = "GET" if req.method == "HEAD" else req.method
        if seg[0] == "api":
            return self._route_api(req, m, seg[1:])
        if seg[0] == "_lfs" and len(seg) == 2 and m == "PUT":
            return self._lfs_put(seg[1], req.body)
        # /{prefix}{ns}/{name}.git/info/lfs/objects/(batch|verify)
        repo_type = _REPO_TYPES.get(seg[0]) if seg[0] in ("datasets", "spaces") else "model"
        rest = seg[1:] if seg[0] in ("datasets", "spaces") else seg
        if len(rest) == 6 and rest[1].endswith(".git") and rest[2:5] == ["info", "lfs", "objects"] and m == "POST":
            repo = self._repo(repo_type, f"{rest[0]}/{rest[1][:-4]}", req.authed, write=True)
            return self._lfs_batch(repo, req) if rest[5] == "batch" else self._lfs_verify(req)
        # /{prefix}{ns}/{name}/resolve/{rev}/{path...}; the revision is quoted with safe="" (refs%2Fpr%2F1)
        if len(rest) >= 5 and rest[2] == "resolve" and m == "GET":
            return self._resolve(req, self._repo(repo_type, f"{rest[0]}/{rest[1]}", req.authed), rest[3],
                                 "/".join(rest[4:]))
        return None

    def _route_api(self, req, m, seg):
        if seg == ["whoami-v2"] and m == "GET":
            return self._whoami(req)
        if seg == ["validate-yaml"] and m == "POST":
            return _json({"errors": [], "warnings": []})
        if seg[:1] == ["repos"] and len(seg) == 2:
            return self._repos_op(req, m, seg[1])
        if len(seg) < 3 or seg[0] not in _REPO_TYPES:
            return None
        repo_type, repo_id, op, args = _REPO_TYPES[seg[0]], f"{seg[1]}/{seg[2]}", seg[3:4], seg[4:]
        op = op[0] if op else None
        write = (m, op) in {("POST", "preupload"), ("POST", "commit"), ("PUT", "settings"), ("POST", "branch"),
                            ("DELETE", "branch"), ("POST", "tag")}
        repo = self._repo(repo_type, repo_id, req.authed, write=write)
        rev, after_rev = _revision(args)
        if m == "GET" and op is None:
            return self._info(req, repo, "main")
        if m == "GET" and op == "revision" and args:
            return self._info(req, repo, rev)
        if m == "GET" and op == "tree" and args:
            return self._tree(req, repo, rev, "/".join(after_rev))
        if m == "POST" and op == "paths-info" and args:
            return self._paths_info(req, repo, rev)
        if m == "POST" and op == "preupload" and args:
            return self._preupload(req, repo, rev)
        if m == "POST" and op == "commit" and args:
            return self._commit_op(req, repo, rev)
        if m == "GET" and op == "refs":
            return self._refs(req, repo)
        if m == "GET" and op == "commits" and args:
            return self._commits(repo, rev)
        if op == "branch" and args and m in ("POST", "DELETE"):
            return self._branch(req, repo, m, rev)
        if m == "POST" and op == "tag" and args:
            tag = req.json()["tag"]
            if tag in repo.tags:
                raise HubError(409, f"Tag {tag} already exists")
            repo.tags[tag] = self._commit(repo, rev).oid
            return _json({})
        if m == "PUT" and op == "settings":
            body = req.json()
            if "private" in body or "visibility" in body:
                repo.private = bool(body.get("private", body.get("visibility") == "private"))
            return _json({})
        return None

    # ---- state helpers ---------------------------------------------------------------------------------------

    def _repo(self, repo_type: str, repo_id: str, authed: bool, write: bool = False) -> _Repo:
        repo = self.repos.get((repo_type, repo_id))
        if repo is None or (repo.private and not authed):
            # the Hub hides private repos from anonymous callers behind the same "not found" answer
            raise HubError(401 if not authed else 404, f"Repository Not Found for {repo_type} {repo_id}",
                           "RepoNotFound")
        if write and not authed:
            raise HubError(401, "You must be authenticated to write to a repo")
        return repo

    def _commit(self, repo: _Repo, revision: str) -> _Commit:
        oid = repo.branches.get(revision) or repo.tags.get(revision)
        if oid is None and len(revision) >= 7:  # a commit sha (or a unique prefix of one)
            matches = [c for c in repo.commits if c.startswith(revision.lower())]
            oid = matches[0] if len(matches) == 1 else None
        if oid is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return repo.commits[oid]

    def _new_commit(self, repo: _Repo, branch: str, files: dict[str, _File], title: str, message: str = "",
                    parents: list[str] | None = None) -> _Commit:
        seed = f"{repo.type}/{repo.id}/{branch}/{next(self._counter)}/{time.time_ns()}/{title}"
        oid = hashlib.sha1(seed.encode()).hexdigest()
        if parents is None:
            parents = [repo.branches[branch]] if branch in repo.branches else []
        commit = _Commit(oid, parents, title, message, _now(), files)
        repo.commits[oid] = commit
        repo.branches[branch] = oid
        return commit

    @staticmethod
    def _is_lfs_path(commit: _Commit, path: str, size: int) -> bool:
        if size >= LFS_SIZE_THRESHOLD:
            return True
        attributes = commit.files.get(".gitattributes")
        for line in (attributes.data.decode(errors="replace") if attributes else "").splitlines():
            parts = line.split()
            if len(parts) > 1 and "filter=lfs" in parts[1:]:
                pattern = parts[0]
                # gitattributes: a pattern without "/" matches the basename at any depth
                target = path if "/" in pattern else path.rsplit("/", 1)[-1]
                if fnmatch.fnmatchcase(target, pattern.lstrip("/")):
                    return True
        return False

    # ---- endpoints -------------------------------------------------------------------------------------------

    def _whoami(self, req):
        if not req.authed:
            raise HubError(401, "Invalid username or password.")
        return _json({
            "type": "user", "id": "0" * 24, "name": self.user, "fullname": "Fake User", "email": None,
            "emailVerified": True, "isPro": False, "canPay": False, "orgs": [],
            "auth": {"type": "access_token", "accessToken": {"displayName": "fake", "role": "write",
                                                             "createdAt": "2024-01-01T00:00:00.000Z"}},
        })

    def _repos_op(self, req, m, what):
        if not req.authed:
            raise HubError(401, "You must be authenticated")
        body = req.json()
        repo_type = body.get("type") or "model"
        repo_id = f"{body.get('organization') or self.user}/{body['name']}"
        key = (repo_type, repo_id)
        url = f"{self.url}/{_URL_PREFIX[repo_type]}{repo_id}"
        if what == "create" and m == "POST":
            if key in self.repos:  # create_repo(exist_ok=True) expects exactly this 409
                raise HubError(409, f"You already created this {repo_type} repo", extra={"url": url})
            private = body.get("private", body.get("visibility") == "private")
            repo = self.repos[key] = _Repo(repo_type, repo_id, bool(private))
            self._new_commit(repo, "main", {".gitattributes": _File(DEFAULT_GITATTRIBUTES.encode())},
                             "initial commit")
            return _json({"url": url, "name": repo_id, "id": hashlib.sha1(repo_id.encode()).hexdigest()[:24]})
        if what == "delete" and m == "DELETE":
            if self.repos.pop(key, None) is None:
                raise HubError(404, f"Repository Not Found for {repo_type} {repo_id}", "RepoNotFound")
            return _json({})
        return None

    def _entry(self, repo: _Repo, commit: _Commit, path: str, expand: bool) -> dict:
        """A tree / paths-info item for ``path`` (a file or a directory) in ``commit``."""
        f = commit.files.get(path)
        if f is not None:
            item = {"type": "file", "oid": f.git_oid, "size": f.size, "path": path}
            if f.sha256:
                item["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": len(f.pointer)}
        else:
            below = sorted((p, g.git_oid) for p, g in commit.files.items() if p.startswith(path + "/"))
            item = {"type": "directory", "oid": hashlib.sha1(repr(below).encode()).hexdigest(), "size": 0,
                    "path": path}
        if expand:
            last = self._last_commit(repo, commit, path)
            item["lastCommit"] = {"id": last.oid, "title": last.title, "date": last.date}
        return item

    def _last_commit(self, repo: _Repo, commit: _Commit, path: str) -> _Commit:
        """The newest ancestor of ``commit`` (first-parent walk) that changed something at or below ``path``."""

        def snap(c):
            return {p: f.git_oid for p, f in c.files.items() if p == path or p.startswith(path + "/")}

        while commit.parents and snap(repo.commits[commit.parents[0]]) == snap(commit):
            commit = repo.commits[commit.parents[0]]
        return commit

    def _info(self, req, repo: _Repo, revision: str):
        commit = self._commit(repo, revision)
        blobs = req.flag("blobs")
        siblings = []
        for path in sorted(commit.files):
            sib = {"rfilename": path}
            if blobs:
                entry = self._entry(repo, commit, path, False)
                sib.update(size=entry["size"], blobId=entry["oid"])
                if "lfs" in entry:
                    sib["lfs"] = {"sha256": entry["lfs"]["oid"], "size": entry["size"],
                                  "pointerSize": entry["lfs"]["pointerSize"]}
            siblings.append(sib)
        return _json({
            "_id": hashlib.sha1(repo.id.encode()).hexdigest()[:24], "id": repo.id, "author": repo.id.split("/")[0],
            "sha": commit.oid, "lastModified": commit.date, "createdAt": repo.created_at, "private": repo.private,
            "gated": False, "disabled": False, "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
            "usedStorage": sum(f.size for f in commit.files.values()),
        })

    def _tree(self, req, repo: _Repo, revision: str, path: str):
        commit = self._commit(repo, revision)
        path = path.strip("/")
        prefix = path + "/" if path else ""
        if path and not any(p.startswith(prefix) for p in commit.files):
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": commit.oid})
        paths: set[str] = set()
        for p in commit.files:
            if not p.startswith(prefix):
                continue
            parts = p[len(prefix):].split("/")
            # every directory level below `path` (recursive) or only the first one
            depth = len(parts) if req.flag("recursive") else 1
            paths.update(prefix + "/".join(parts[:i + 1]) for i in range(depth))
        expand = req.flag("expand")
        return _json([self._entry(repo, commit, p, expand) for p in sorted(paths)])

    def _paths_info(self, req, repo: _Repo, revision: str):
        commit = self._commit(repo, revision)
        form = req.form()
        expand = str((form.get("expand") or ["false"])[0]).lower() in ("1", "true")
        items = []
        for path in form.get("paths", []):
            path = path.strip("/")
            if path in commit.files or any(p.startswith(path + "/") for p in commit.files):
                items.append(self._entry(repo, commit, path, expand))
        return _json(items)

    def _preupload(self, req, repo: _Repo, revision: str):
        commit = self._commit(repo, revision)  # with create_pr too: the PR branches off `revision`
        files = []
        for item in req.json()["files"]:
            lfs = self._is_lfs_path(commit, item["path"], item["size"])
            existing = commit.files.get(item["path"])
            # "oid" lets the client skip unchanged files: the sha256 for LFS files, the git blob oid otherwise
            oid = None if existing is None else (existing.sha256 if lfs else existing.git_oid)
            files.append({"path": item["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                          "oid": oid})
        return _json({"files": files, "commitOid": commit.oid})

    def _lfs_batch(self, repo: _Repo, req):
        body = req.json()
        if body.get("operation") != "upload":
            raise HubError(400, "LocalHub only implements the LFS upload operation")
        objects = []
        for obj in body["objects"]:
            item = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if obj["oid"] not in self.lfs_objects:  # no "actions" = already stored, the client skips it
                item["actions"] = {
                    # a single PUT of the raw bytes (no chunk_size header => no multipart), like a presigned URL
                    "upload": {"href": f"{self.url}/_lfs/{obj['oid']}"},
                    "verify": {"href": f"{self.url}/{repo.url_path}.git/info/lfs/objects/verify"},
                }
            objects.append(item)
        return _json({"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
                     content_type="application/vnd.git-lfs+json")

    def _lfs_put(self, oid: str, body: bytes):
        if hashlib.sha256(body).hexdigest() != oid:
            raise HubError(400, f"LFS upload: content does not hash to {oid}")
        self.lfs_objects[oid] = body
        return 200, {"ETag": f'"{oid}"'}, b""

    def _lfs_verify(self, req):
        body = req.json()
        data = self.lfs_objects.get(body["oid"])
        if data is None or len(data) != body["size"]:
            raise HubError(404, f"LFS object {body['oid']} not found")
        return _json({})

    def _commit_op(self, req, repo: _Repo, revision: str):
        lines = [json.loads(line) for line in req.body.splitlines() if line.strip()]
        header = next((ln["value"] for ln in lines if ln["key"] == "header"), {})
        if req.flag("create_pr"):
            base = self._commit(repo, revision)
            repo.prs += 1
            branch, parents = f"refs/pr/{repo.prs}", [base.oid]
        else:
            if revision not in repo.branches:
                raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
            base, branch, parents = self._commit(repo, revision), revision, None
        parent = header.get("parentCommit")
        if parent and parent != base.oid:
            raise HubError(412, f"A commit has happened since {parent}: {revision} is at {base.oid}")
        files = dict(base.files)
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "file":
                data = value["content"].encode()
                files[value["path"]] = _File(base64.b64decode(data) if value.get("encoding") == "base64" else data)
            elif key == "lfsFile":
                data = self.lfs_objects.get(value["oid"])
                if data is None:
                    raise HubError(422, f"Your push was rejected because an LFS pointer pointed to a file that does "
                                        f"not exist: {value['path']} ({value['oid']})")
                files[value["path"]] = _File(data, sha256=value["oid"])
            elif key == "deletedFile":
                if files.pop(value["path"], None) is None:
                    raise HubError(404, f"A file with this name doesn't exist: {value['path']}", "EntryNotFound")
            elif key == "deletedFolder":
                folder = value["path"].rstrip("/") + "/"
                gone = [p for p in files if p.startswith(folder)]
                if not gone:
                    raise HubError(404, f"A folder with this name doesn't exist: {value['path']}", "EntryNotFound")
                for p in gone:
                    del files[p]
            elif key != "header":
                raise HubError(400, f"LocalHub: unknown commit operation {key!r}")
        commit = self._new_commit(repo, branch, files, header.get("summary", ""), header.get("description", ""),
                                  parents)
        answer = {"success": True, "commitOid": commit.oid, "commitUrl": f"{self.url}/{repo.url_path}/commit/"
                  f"{commit.oid}", "hookOutput": ""}
        if branch.startswith("refs/pr/"):
            answer["pullRequestUrl"] = f"{self.url}/{repo.url_path}/discussions/{repo.prs}"
        return _json(answer)

    def _refs(self, req, repo: _Repo):
        def refs(names, kind):
            return [{"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": o} for n, o in sorted(names.items())]

        branches = {n: o for n, o in repo.branches.items() if not n.startswith("refs/")}
        answer = {"branches": refs(branches, "heads"), "tags": refs(repo.tags, "tags"), "converts": []}
        if req.flag("include_prs"):
            answer["pullRequests"] = [{"name": n[5:], "ref": n, "targetCommit": o}
                                      for n, o in sorted(repo.branches.items()) if n.startswith("refs/pr/")]
        return _json(answer)

    def _commits(self, repo: _Repo, revision: str):
        commit, out = self._commit(repo, revision), []
        while True:
            out.append({"id": commit.oid, "title": commit.title, "message": commit.message, "date": commit.date,
                        "authors": [{"user": self.user}]})
            if not commit.parents:
                return _json(out)
            commit = repo.commits[commit.parents[0]]

    def _branch(self, req, repo: _Repo, m, branch: str):
        if m == "DELETE":
            if repo.branches.pop(branch, None) is None:
                raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            return _json({})
        if branch in repo.branches:
            raise HubError(409, f"Branch {branch} already exists")
        start = self._commit(repo, req.json().get("startingPoint") or "main")
        repo.branches[branch] = start.oid
        return _json({})

    def _resolve(self, req, repo: _Repo, revision: str, path: str):
        commit = self._commit(repo, revision)
        f = commit.files.get(path)
        headers = {"X-Repo-Commit": commit.oid}
        if f is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", headers)
        # The client uses X-Linked-Etag (falling back to ETag) as the cache blob name and X-Linked-Size (falling back
        # to Content-Length) as the expected size. The Hub answers an LFS file with a 302 to its CDN carrying
        # those; serving the bytes here directly with the same headers is equivalent for the client.
        etag = f'"{f.sha256 or f.git_oid}"'
        headers.update({"ETag": etag, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"})
        if f.sha256:
            headers.update({"X-Linked-Etag": etag, "X-Linked-Size": str(f.size)})
        data, status = f.data, 200
        rng = req.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng[6:].split(",")[0].partition("-")
            if first == "":  # suffix range: the last N bytes
                start, end = max(f.size - int(last), 0), f.size - 1
            else:
                start, end = int(first), min(int(last) if last else f.size - 1, f.size - 1)
            if start >= f.size and f.size > 0:
                raise HubError(416, "Requested range not satisfiable", headers={"Content-Range": f"bytes */{f.size}"})
            data, status = f.data[start:end + 1], 206
            headers["Content-Range"] = f"bytes {start}-{end}/{f.size}"
        return status, headers, data


@dataclass
class _Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: object
    body: bytes
    authed: bool

    def json(self) -> dict:
        try:
            return json.loads(self.body or b"{}")
        except ValueError as e:
            raise HubError(400, f"Invalid JSON body: {e}") from None

    def form(self) -> dict[str, list[str]]:
        """A form-encoded body (``paths=a&paths=b``) or a JSON one."""
        if "json" in (self.headers.get("Content-Type") or ""):
            return {k: v if isinstance(v, list) else [v] for k, v in self.json().items()}
        return urllib.parse.parse_qs(self.body.decode(), keep_blank_values=True)

    def flag(self, name: str) -> bool:
        return (self.query.get(name) or ["false"])[0].lower() in ("1", "true")


def _revision(args: list[str]) -> tuple[str, list[str]]:
    """``(revision, the segments after it)`` from URL segments (each already unquoted: the clients quote a
    revision with ``safe=""``, so ``refs%2Fpr%2F1`` is one segment); tolerates an unquoted ``refs/pr/N``."""
    if not args:
        return "main", []
    n = 3 if args[0] == "refs" and len(args) >= 3 else 1
    return "/".join(args[:n]), args[n:]


def _json(obj, status: int = 200, content_type: str = "application/json"):
    return status, {"Content-Type": content_type}, json.dumps(obj).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: every answer has a Content-Length, every body is read in full
    hub: LocalHub

    def _serve(self):
        body = self._read_body()
        status, headers, payload = self.hub.handle(self.command, self.path, self.headers, body)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

    def log_message(self, format, *args):  # silence the default stderr access log
        pass


# ---- pointing the clients at a LocalHub ------------------------------------------------------------------------


@contextlib.contextmanager
def hub_env(url: str, home: str | os.PathLike, token: str = FAKE_TOKEN):
    """Make ``huggingface_hub``, ``datasets`` and ``transformers`` (in this process) use the Hub at ``url``.

    Sets the environment (``HF_ENDPOINT=url``, ``HF_HUB_OFFLINE=0``, ``HF_HUB_DISABLE_XET=1``, ``HF_TOKEN=token``,
    ``HF_HOME=home``, ...) and, because those libraries read most of it once at import time, also patches the
    copies they keep: ``huggingface_hub.constants`` (ENDPOINT, offline flag, Xet switch, cache folders), the
    endpoint of the module-level ``HfApi`` behind ``huggingface_hub.create_repo`` & co., and ``datasets.config``
    (endpoint, offline flag, cache folders, download counter). Everything is restored on exit; fsspec's
    ``HfFileSystem`` instances and the shared HTTP client are dropped on entry and exit so none outlives it.
    ``home`` should be a fresh folder (a test's ``tmp_path``): all caches go under it.
    """
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub import hf_api as hf_api_module
    from huggingface_hub.utils import _http

    home = Path(home)
    hub_cache, token_path = home / "hub", home / "token"
    env = {
        "HF_ENDPOINT": url, "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0",
        "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": token, "HF_HOME": str(home), "HF_HUB_CACHE": str(hub_cache),
        "HF_DATASETS_CACHE": str(home / "datasets"), "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_UPDATE_DOWNLOAD_COUNTS": "0", "HF_TOKEN_PATH": str(token_path),
        "NO_PROXY": ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1", "localhost"])),
        "no_proxy": ",".join(filter(None, [os.environ.get("no_proxy"), "127.0.0.1", "localhost"])),
    }
    patches = [
        (constants, "ENDPOINT", url),
        (constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}"),
        (constants, "HF_URL_HOSTS", constants.HF_URL_HOSTS | {"127.0.0.1"}),
        (constants, "HF_HUB_OFFLINE", False),
        (constants, "HF_HUB_DISABLE_XET", True),
        (constants, "HF_HUB_DISABLE_TELEMETRY", True),
        (constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", False),
        (constants, "HF_HOME", str(home)),
        (constants, "HF_HUB_CACHE", str(hub_cache)),
        (constants, "HUGGINGFACE_HUB_CACHE", str(hub_cache)),
        (constants, "HF_ASSETS_CACHE", str(home / "assets")),
        (constants, "HF_XET_CACHE", str(home / "xet")),
        (constants, "HF_TOKEN_PATH", str(token_path)),
        (constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens")),
        (hf_api_module.api, "endpoint", url),  # `huggingface_hub.create_repo` etc. are methods of this instance
    ]
    if importlib.util.find_spec("datasets") is not None:
        import datasets.config as dconfig  # imported here so its import-time values are restored on exit

        patches += [
            (dconfig, "HF_ENDPOINT", url),
            (dconfig, "HUB_DATASETS_URL", url + "/datasets/{repo_id}/resolve/{revision}/{path}"),
            (dconfig, "HF_HUB_OFFLINE", False),
            (dconfig, "HF_DATASETS_OFFLINE", False),
            (dconfig, "HF_UPDATE_DOWNLOAD_COUNTS", False),
            (dconfig, "HF_CACHE_HOME", str(home)),
            (dconfig, "HF_DATASETS_CACHE", home / "datasets"),
            (dconfig, "HF_MODULES_CACHE", home / "modules"),
            (dconfig, "DOWNLOADED_DATASETS_PATH", home / "datasets" / "downloads"),
            (dconfig, "EXTRACTED_DATASETS_PATH", home / "datasets" / "downloads" / "extracted"),
        ]
    saved_env = {k: os.environ.get(k) for k in env}
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]

    def reset_clients():
        huggingface_hub.HfFileSystem.clear_instance_cache()  # fsspec caches instances (with their endpoint)
        _http.close_session()  # pooled connections to this (soon stopped) server
        if importlib.util.find_spec("transformers") is not None:
            import transformers.utils.hub as transformers_hub

            transformers_hub._hf_api = None  # transformers keeps one shared HfApi (with its endpoint) per process

    try:
        os.environ.update(env)
        for obj, name, value in patches:
            setattr(obj, name, value)
        reset_clients()
        yield
    finally:
        reset_clients()
        for obj, name, value in saved:
            setattr(obj, name, value)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
