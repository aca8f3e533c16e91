"""EdgeExport: what a small device runs without our stack — TorchScript of the network, the featurizer as JSON, one script.

Layout (written into every registered model under ``artifacts/edge/``, so it is inside the
signed bundle and covered by its manifest)::

    network.ts        torch.jit.script of the TabularMLP (loads with torch alone: torch.jit.load)
    featurizer.json   Featurizer.to_dict(): medians, means, stds, vocabularies
    columns.json      {"columns": {name: type}, "closed": [...]} as the RecordModel has it
    score.py          a standalone scorer: python + torch, no pandas, no mlflow, no hybridtrain

On the device: ``python score.py records.json`` prints one probability per record, or
``from score import EdgeModel; EdgeModel(dir).score([{...}])``. With ``--public-key`` the
script first checks the package the ``edge`` release target wrote (``manifest.json`` and
``signature.json`` three levels up): the Ed25519 signature over the manifest (needs the
``cryptography`` package) and the SHA-256 of every file it will load; it refuses to score if any
check fails. The edge target itself verifies the full bundle before it writes the package.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

NETWORK_TS = "network.ts"
SCRIPT = "score.py"
SCRIPT_SOURCE = Path(__file__).with_name("edge_score.py")
#: TorchScript compiles into one global compilation unit and is not thread-safe: two trials of an
#: in-process sweep exporting at once failed with "Can't redefine method: forward on class ... Linear".
_SCRIPT_LOCK = threading.Lock()


def export(network: Any, featurizer: Any, columns: dict[str, str], dest: Path) -> Path:
    """Write the edge export of ``network`` and ``featurizer`` into ``dest`` (created)."""
    import torch

    from hybridtrain.training.featurizer import MAX_CATEGORIES

    dest.mkdir(parents=True, exist_ok=True)
    was_training = network.training
    network.eval()
    try:
        with _SCRIPT_LOCK:
            scripted = torch.jit.script(network)
            scripted.save(str(dest / NETWORK_TS))
    finally:
        network.train(was_training)
    (dest / "featurizer.json").write_text(json.dumps(featurizer.to_dict(), sort_keys=True))
    closed = [c.name for c in featurizer.categorical if len(c.vocabulary) < MAX_CATEGORIES]
    (dest / "columns.json").write_text(json.dumps({"columns": columns, "closed": closed}, sort_keys=True))
    shutil.copyfile(SCRIPT_SOURCE, dest / SCRIPT)
    return dest
