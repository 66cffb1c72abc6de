"""Hugging Face hub ids as --model values: resolved through huggingface_hub's cache (HF_HOME,
HF_TOKEN and HF_HUB_OFFLINE are its own), fetching only the files a server reads."""

from __future__ import annotations

import logging
from pathlib import Path

from rose.errors import ModelError

log = logging.getLogger(__name__)

SERVED_FILES = (
    "config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "modules.json",
    "config_sentence_transformers.json",
    "sentence_bert_config.json",
    "*_Pooling/config.json",
    "*_Dense/config.json",
    "*_Dense/*.safetensors",
)
"""What a server reads of a model repository: its config, weights and tokenizer, and the
sentence-transformers modules' settings (fnmatch patterns, as huggingface_hub takes them)."""


def hub_id(root: Path) -> str | None:
    """The repository id of a folder inside huggingface_hub's cache (…/models--org--name/snapshots/<commit>)."""
    repo = root.parent.parent.name
    if root.parent.name == "snapshots" and repo.startswith("models--"):
        return repo.removeprefix("models--").replace("--", "/")
    return None


def download(repo_id: str, revision: str | None = None) -> Path:
    """The local snapshot of `repo_id` at `revision` (default: main), fetched into the cache unless
    it is there already or the hub is offline."""
    try:
        import huggingface_hub
        from huggingface_hub import errors
    except ImportError as why:
        raise ModelError(f"--model {repo_id!r} is not a folder, and huggingface_hub is not installed") from why

    where = f"{repo_id!r}" + (f" at revision {revision!r}" if revision else "")
    log.info("resolving the hub model %s through huggingface_hub's cache", where)
    try:
        path = huggingface_hub.snapshot_download(repo_id, revision=revision, allow_patterns=list(SERVED_FILES))
    except errors.GatedRepoError as why:
        raise ModelError(f"the hub model {where} is gated: accept its terms and set HF_TOKEN") from why
    except errors.RepositoryNotFoundError as why:
        raise ModelError(
            f"the hub model {where} was not found (or is private: set HF_TOKEN), and is no local folder"
        ) from why
    except errors.RevisionNotFoundError as why:
        raise ModelError(f"the hub model {repo_id!r} has no revision {revision!r}") from why
    except errors.LocalEntryNotFoundError as why:
        raise ModelError(
            f"the hub model {where} is not in the cache ({huggingface_hub.constants.HF_HUB_CACHE}) and the hub "
            "cannot be reached (HF_HUB_OFFLINE is set, or there is no network): download it once online"
        ) from why
    except (errors.HfHubHTTPError, OSError, ValueError) as why:
        raise ModelError(f"cannot fetch the hub model {where}: {why}") from why
    return Path(path)
