"""The secret-name floor: the names whose values are hashed whatever any configuration says.

`secret_patterns` in group_vars can only add names (reconciler/desired/secret_names.py
`effective` puts this floor back under every list). The box programs union it too, from this
same module packed into each (reconciler/box_program.py), so an old or crafted payload cannot
switch hashing off on the box either. One copy for the controller and both box programs.

The globs are chosen against the keys a lab box's `.env` and containers really carry: they hash
every key lobes and vLLM read a secret from, and none of the values drift compares in the clear
(`*_MAX_NUM_BATCHED_TOKENS`, `TOKENIZERS_PARALLELISM`, `*_KV_CACHE_DTYPE` stay readable, which
is why there is no `*_TOKENS` or `*TOKEN*`). Stdlib only (nothing at all), Python >= 3.8.
"""

# The names the mesh's own keys live under, spelled out so the list documents them ...
FLOOR_NAMES = (
    "GATEWAY_API_KEY",
    "CULTURE_VLLM_API_KEY",
    "LOBES_MESH_KEY",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "VLLM_API_KEY",
)
# ... and the shapes every other secret name takes.
FLOOR_GLOBS = (
    "*_API_KEY",
    "*_API_KEYS",
    "*_KEY",
    "*_KEYS",
    "*_TOKEN",
    "*SECRET*",
    "*PASSWORD*",
    "*PASSWD*",
    "*_CREDENTIALS",
)
FLOOR = FLOOR_NAMES + FLOOR_GLOBS
