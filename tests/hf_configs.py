"""config.json of architectures the first shipped models did not use, as shipped in conf/model/hf (transcribed from
the models' Hugging Face cards: the fields vLLM reads): the tests build these models straight from them."""
from __future__ import annotations

import json

from kernelsight.predictor.paths import conf_dir

FILES = {"glm-4.5": "zai-org--GLM-4.5", "glm-4.5-air": "zai-org--GLM-4.5-Air",
         "deepseek-v2-lite": "deepseek-ai--DeepSeek-V2-Lite", "qwen1.5-moe-a2.7b": "Qwen--Qwen1.5-MoE-A2.7B",
         "gemma-3-27b": "google--gemma-3-27b-it", "gemma-3-1b": "google--gemma-3-1b-it"}
CONFIGS = {name: json.loads((conf_dir() / "model" / "hf" / f"{stem}_config.json").read_text())
           for name, stem in FILES.items()}
GLM_45_AIR, QWEN15_MOE = CONFIGS["glm-4.5-air"], CONFIGS["qwen1.5-moe-a2.7b"]
