"""`agnews push`: publish a training output folder on the Hub with huggingface_hub. Called by the command and at the end
of training with --push_to_hub.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from huggingface_hub import HfApi, get_token
from huggingface_hub.errors import HfHubHTTPError

from contract import files
from contract.errors import UserError
from contract.hub import hub_reachable, hub_url, is_offline
from training import arguments
from training.cli import run_command, setup_logging
from training.output import model_card

logger = logging.getLogger(__name__)
IGNORE = [f"{files.STATE_DIR}/*", ".*", "*/.*", "*.tmp"]  # resumable states, temporary and hidden files


def check_can_push(repo_id: str | None, training_run: bool = True) -> None:
    """A repository name, a reachable Hub and a token, or one line naming what is missing."""
    if not repo_id:
        raise UserError("push_to_hub: give --hub_model_id (user/name or org/name)")
    if is_offline() or not hub_reachable():
        # what the later push needs
        later = "`python -m training.push --checkpoint_dir DIR --hub_model_id ID`" if training_run else "this command"
        raise UserError(
            f"push_to_hub: the Hugging Face Hub ({hub_url()}) is out of reach"
            f"{' (HF_HUB_OFFLINE is set)' if is_offline() else ''}; push later with {later} from a machine that "
            "reaches it" + (" (unset HF_HUB_OFFLINE)" if is_offline() else "")
        )
    if not get_token():
        raise UserError("push_to_hub: no Hugging Face token: set HF_TOKEN or run `hf auth login`")


def push(folder: Path, repo_id: str, private: bool = False, api: HfApi | None = None) -> str:
    """Create the repository and upload the folder; the URL."""
    api = api or HfApi()
    metrics = folder / files.METRICS
    if metrics.is_file():  # the card names the repository it is published in
        model_card.write_model_card(folder, json.loads(metrics.read_text()), repo_id)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            repo_type="model",
            ignore_patterns=IGNORE,
            commit_message="Upload model trained with distilbert-agnews",
        )
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise UserError(f"push to {repo_id}: {' '.join(str(exc).split())[:300]}") from None
    logger.info("Pushed %s to %s", folder, getattr(commit, "commit_url", repo_id))
    return getattr(commit, "commit_url", repo_id)


def cli(argv: list[str] | None = None) -> int:
    setup_logging()
    args = arguments.push().parse_args(argv)
    return run_command(lambda: push_folder(Path(args.checkpoint_dir), args.hub_model_id, args.private))


def push_folder(folder: Path, repo_id: str, private: bool) -> None:
    """Push a checked output folder."""
    if not (folder / files.CONFIG).is_file():
        raise UserError(f"{folder / files.CONFIG}: missing; is {folder} a training output dir?")
    if why := files.stale_export(folder):
        raise UserError(
            f"{why}: it would be published beside weights it does not hold. Export it again (agnews export {folder} "
            f"--runtime onnxruntime) or remove {folder / files.ONNX_DIR}"
        )
    check_can_push(repo_id, training_run=False)
    push(folder, repo_id, private)


if __name__ == "__main__":
    sys.exit(cli())
