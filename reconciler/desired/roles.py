"""What lobes 0.91.0 calls each role, and which `.env` keys it reads for it.

These tables are facts about the managed system (lobes/templates/fleet/docker-compose.yml and
lobes/roles.py), not policy: the desired-state models use them to turn a lane's typed fields
into the `.env` keys lobes' compose file interpolates.
"""

from __future__ import annotations

# The 12 role keys of the gateway's /capabilities, in lobes' ROLES order.
ROLES: tuple[str, ...] = (
    "cortex",
    "senses",
    "muse",
    "worker",
    "associate",
    "hand",
    "decider",
    "embedder",
    "reranker",
    "stt",
    "tts",
    "innereye",
)

# Role -> the `<PREFIX>_` of its `.env` knobs (`<PREFIX>_MAX_MODEL_LEN`, `_GPU_MEM_UTIL`, ...).
ENV_PREFIX: dict[str, str] = {
    "cortex": "PRIMARY",
    "senses": "MULTIMODAL",
    "muse": "MUSE",
    "worker": "WORKER",
    "associate": "ASSOCIATE",
    "hand": "HAND",
    "decider": "DECIDER",
    "embedder": "EMBED",
    "reranker": "RERANK",
    "innereye": "INNEREYE",
}

# Role -> the compose variable that picks its lane's image. Lanes without their own variable
# share VLLM_NIGHTLY_IMAGE, so two such lanes on one box must want the same image.
IMAGE_VARIABLE: dict[str, str] = {
    "cortex": "VLLM_NIGHTLY_IMAGE",
    "embedder": "VLLM_NIGHTLY_IMAGE",
    "reranker": "VLLM_NIGHTLY_IMAGE",
    "worker": "WORKER_IMAGE",
    "associate": "ASSOCIATE_IMAGE",
    "hand": "HAND_IMAGE",
    "senses": "MULTIMODAL_IMAGE",
    "muse": "MUSE_IMAGE",
    "innereye": "INNEREYE_IMAGE",
}

# Role -> the compose service (lane) lobes runs for it.
SERVICE: dict[str, str] = {
    "cortex": "vllm-primary",
    "senses": "vllm-multimodal",
    "muse": "vllm-muse",
    "worker": "vllm-worker",
    "associate": "vllm-associate",
    "hand": "vllm-hand",
    "embedder": "vllm-embed",
    "reranker": "vllm-rerank",
    "innereye": "comfyui",
}

# The gateway is a compose service too, but it is no lane: it has no image variable in lobes'
# template (it is built from Dockerfile.gateway), so the fleet pins it through GATEWAY_IMAGE,
# which the box's docker-compose.override.yml uses as the gateway's `image:`.
GATEWAY_SERVICE = "gateway"
GATEWAY_IMAGE_VARIABLE = "GATEWAY_IMAGE"
GATEWAY_CONTAINER = "model-gear-gateway"


def container_name(service: str) -> str:
    """lobes fixes container names as `model-gear-<service>`."""
    return f"model-gear-{service}"
