"""What a rank's interpreter made of its environment: `python env_probe.py OUT TAG` writes
OUT/TAG-<rank>.json. With PROBE_HF=1 it also imports transformers (so a warm pool learns it)
and reports what huggingface_hub and transformers took from HF_HOME, HF_HUB_OFFLINE and
TRANSFORMERS_VERBOSITY when they were imported."""

import json
import os
import sys
import warnings

import torch.distributed as dist

if os.environ.get("PROBE_HF") == "1":
    import huggingface_hub.constants
    import transformers

seen = {
    "debug_level": str(dist.get_debug_level()),
    # (random in every fresh interpreter unless PYTHONHASHSEED fixes it)
    "hash": hash("mlcluster") if "PYTHONHASHSEED" in os.environ else None,
    "utf8_mode": sys.flags.utf8_mode,
    "warnoptions": list(sys.warnoptions),
    "first_warning_filter": warnings.filters[0][0] if warnings.filters else None,
    "preferred_encoding": __import__("locale").getpreferredencoding(False),
}
if os.environ.get("PROBE_HF") == "1":
    seen["hf_home"] = huggingface_hub.constants.HF_HOME
    seen["hf_hub_offline"] = huggingface_hub.constants.HF_HUB_OFFLINE
    seen["transformers_verbosity"] = transformers.logging.get_verbosity()
out, tag = sys.argv[1], sys.argv[2]
with open(os.path.join(out, f"{tag}-{os.environ['RANK']}.json"), "w") as f:
    json.dump(seen, f)
