"""A model directory with a published model's architecture and random weights, for the GPU
proof: weights cannot travel to the lent machines (a call carries at most 64 MiB), and memory
and speed do not depend on the weights' values.

    python scripts/trainer/random_model.py CONFIG_JSON OUT_DIR   (bf16 safetensors)"""

import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main(config: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(config, out / "config.json")
    cfg = AutoConfig.from_pretrained(out)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"model": str(out), "parameters": n}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
