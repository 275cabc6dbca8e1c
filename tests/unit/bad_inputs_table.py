"""Bad desired state: every case asserts the exact message and file:line:col.

Each case edits one file of tests/fixtures/fleet (a small, valid fleet) and expects exactly
these problems, sorted by location; generated once, then read and checked by hand."""

BAD_INPUTS = [
    (
        "lane_named_gateway",
        "group_vars/thor.yaml",
        "    role: worker\n",
        "    role: worker\n    service: gateway\n",
        [
            "group_vars/thor.yaml:9:5: lanes.worker.service: a lane cannot be the 'gateway' service: it is the gateway's"
        ],
    ),
    (
        "env_key_longer_than_the_box_takes",
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        "  VLLM_GDN_DECODE_KERNEL: triton\n  K" + "X" * 256 + ": '1'",
        [
            "group_vars/thor.yaml:6:3: env.K"
            + "X" * 256
            + ": string should have at most 256 characters (got 'K"
            + "X" * 256
            + "')"
        ],
    ),
    (
        "tag_not_digest",
        "group_vars/thor.yaml",
        "    image: vllm\n    profile",
        "    image: 'vllm/vllm-openai:latest'\n    profile",
        [
            "group_vars/thor.yaml:9:5: lanes.worker.image: 'vllm/vllm-openai:latest' is not pinned by digest (want repo@sha256:<64 hex>)"
        ],
    ),
    (
        "unknown_top_key",
        "group_vars/thor.yaml",
        "env:\n",
        "envv:\n",
        ["group_vars/thor.yaml:4:1: envv: unknown key; did you mean 'env'?"],
    ),
    (
        "unknown_lane_key",
        "group_vars/thor.yaml",
        "    max_model_len: 262144",
        "    max_model_length: 262144",
        [
            "group_vars/thor.yaml:11:5: lanes.worker.max_model_length: unknown key; did you mean 'max_model_len'?"
        ],
    ),
    (
        "unknown_image_name",
        "group_vars/thor.yaml",
        "    image: vllm\n    profile",
        "    image: vlm\n    profile",
        ["group_vars/thor.yaml:9:5: lanes.worker.image: unknown image 'vlm'; did you mean 'vllm'?"],
    ),
    (
        "malformed_yaml",
        "group_vars/thor.yaml",
        "  shape: thor-worker",
        "  shape: thor-worker: x",
        ["group_vars/thor.yaml:3:21: malformed YAML: mapping values are not allowed here"],
    ),
    (
        "bad_indent",
        "group_vars/spark.yaml",
        "  profile: spark",
        "   profile: spark\n  x",
        ["group_vars/spark.yaml:3:3: malformed YAML: expected <block end>, but found '<scalar>'"],
    ),
    (
        "duplicate_key",
        "group_vars/spark.yaml",
        "  shape: spark-lobe",
        "  shape: spark-lobe\n  shape: other",
        ["group_vars/spark.yaml:4:3: lobes.shape: duplicate key (first at line 3)"],
    ),
    (
        "top_level_list",
        "group_vars/jetson.yaml",
        None,
        "- a\n- b\n",
        ["group_vars/jetson.yaml:1:1: expected a mapping of keys, got a seq"],
    ),
    (
        "string_for_int",
        "group_vars/spark.yaml",
        "    max_model_len: 262144",
        "    max_model_len: '262144'",
        [
            "group_vars/spark.yaml:8:5: lanes.cortex.max_model_len: expected an integer, got str '262144'"
        ],
    ),
    (
        "util_over_one",
        "group_vars/spark.yaml",
        "gpu_memory_utilization: 0.58",
        "gpu_memory_utilization: 1.5",
        [
            "group_vars/spark.yaml:9:5: lanes.cortex.gpu_memory_utilization: input should be less than or equal to 1 (got 1.5)"
        ],
    ),
    (
        "negative_len",
        "group_vars/spark.yaml",
        "    max_model_len: 262144",
        "    max_model_len: -1",
        [
            "group_vars/spark.yaml:8:5: lanes.cortex.max_model_len: input should be greater than 0 (got -1)"
        ],
    ),
    (
        "unknown_role",
        "group_vars/spark.yaml",
        "    role: cortex",
        "    role: cortx",
        [
            "group_vars/spark.yaml:6:5: lanes.cortex.role: 'cortx' is not one of 'cortex', 'senses', 'muse', 'worker', 'associate', 'hand', 'decider', 'embedder', 'reranker', 'stt', 'tts' or 'innereye'"
        ],
    ),
    (
        "gpu_budget",
        "group_vars/thor.yaml",
        "gpu_memory_utilization: 0.45",
        "gpu_memory_utilization: 0.88",
        [
            "group_vars/all.yaml:17:1: gpu_memory_budget: lanes use 0.94 of GPU memory (embed 0.06, worker 0.88), over the budget 0.9 (box thor)"
        ],
    ),
    (
        "proxy_unknown_box",
        "group_vars/thor.yaml",
        "proxied_to: spark",
        "proxied_to: sparc",
        [
            "group_vars/thor.yaml:17:12: contract.cortex.proxied_to: unknown box 'sparc'; did you mean 'spark'?"
        ],
    ),
    (
        "proxy_not_hosted",
        "group_vars/spark.yaml",
        "  worker: {proxied_to: thor}",
        "  senses: {proxied_to: thor}",
        [
            "group_vars/spark.yaml:12:12: contract.senses.proxied_to: thor does not host 'senses' (no contract.senses.context)"
        ],
    ),
    (
        "secret_literal",
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        "  HF_TOKEN: hf_abcdef123456",
        [
            "group_vars/thor.yaml:5:3: env.HF_TOKEN: HF_TOKEN is a secret name: use {secret: <name>}, never a literal value"
        ],
    ),
    (
        "secret_ref_undeclared",
        "group_vars/all.yaml",
        "  api_key: {secret: gateway_api_key}",
        "  api_key: {secret: gateway_key}",
        [
            "group_vars/all.yaml:21:13: gateway.api_key.secret: secret 'gateway_key' is not declared in secrets:; did you mean 'gateway_api_key'?"
        ],
    ),
    (
        "keyed_without_key",
        "group_vars/all.yaml",
        "  api_key: {secret: gateway_api_key}\n",
        "",
        [
            "group_vars/all.yaml:20:3: gateway.auth: auth is keyed but gateway.api_key names no secret"
        ],
    ),
    (
        "open_with_key",
        "group_vars/all.yaml",
        "  auth: keyed",
        "  auth: open",
        [
            "group_vars/all.yaml:21:3: gateway.api_key: auth is open: remove api_key or set auth: keyed"
        ],
    ),
    (
        "auth_literal",
        "group_vars/all.yaml",
        "  auth: keyed",
        "  auth: yes-please",
        ["group_vars/all.yaml:20:3: gateway.auth: 'yes-please' is not one of 'keyed' or 'open'"],
    ),
    (
        "mesh_without_key",
        "group_vars/all.yaml",
        "  key: {secret: mesh_key}\n",
        "",
        [
            "group_vars/all.yaml:23:3: mesh.enabled: the mesh is enabled but mesh.key names no secret"
        ],
    ),
    (
        "context_mismatch",
        "group_vars/thor.yaml",
        "  worker: {context: 262144}",
        "  worker: {context: 131072}",
        [
            "group_vars/thor.yaml:16:12: contract.worker.context: advertises 131072 but lane 'worker' serves max_model_len 262144"
        ],
    ),
    (
        "context_and_proxy",
        "group_vars/thor.yaml",
        "  worker: {context: 262144}",
        "  worker: {context: 262144, proxied_to: spark}",
        [
            "group_vars/thor.yaml:16:3: contract.worker: set exactly one of context (served here) or proxied_to (another box)",
            "group_vars/thor.yaml:16:29: contract.worker.proxied_to: spark does not host 'worker' (no contract.worker.context)",
        ],
    ),
    (
        "proxied_role_no_longer_hosted",
        "group_vars/thor.yaml",
        "  worker: {context: 262144}\n",
        "",
        [
            "group_vars/spark.yaml:12:12: contract.worker.proxied_to: thor does not host 'worker' (no contract.worker.context)"
        ],
    ),
    (
        "env_key_lowercase",
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        "  vllm_gdn_decode_kernel: triton",
        [
            "group_vars/thor.yaml:5:3: env.vllm_gdn_decode_kernel: 'vllm_gdn_decode_kernel' does not match the pattern ^[A-Z_][A-Z0-9_]*$"
        ],
    ),
    (
        "env_shadows_typed",
        "group_vars/thor.yaml",
        "      WORKER_MAX_NUM_SEQS: 1",
        "      WORKER_MAX_MODEL_LEN: 131072",
        [
            "group_vars/thor.yaml:14:7: lanes.worker.env.WORKER_MAX_MODEL_LEN: WORKER_MAX_MODEL_LEN is already set by lanes.worker.max_model_len"
        ],
    ),
    (
        "secret_source_unknown",
        "group_vars/all.yaml",
        "source: controller_env",
        "source: vault",
        [
            "group_vars/all.yaml:10:3: secrets.mesh_key: source 'vault' is not one of 'box_file', 'controller_env'"
        ],
    ),
    (
        "version_not_semver",
        "group_vars/all.yaml",
        '  version: "0.91.0"',
        "  version: latest",
        [
            "group_vars/all.yaml:2:3: lobes.version: 'latest' is not a version MAJOR.MINOR.PATCH (digits only)"
        ],
    ),
    (
        "version_as_float",
        "group_vars/all.yaml",
        '  version: "0.91.0"',
        "  version: 0.91",
        ["group_vars/all.yaml:2:3: lobes.version: expected a string, got float 0.91"],
    ),
    (
        "stray_group_file",
        "group_vars/thro.yaml",
        None,
        "env: {}\n",
        ["group_vars/thro.yaml:1:1: no box or group is named 'thro'; did you mean thor.yaml?"],
    ),
    (
        "inventory_unknown_group",
        "inventory/hosts.yaml",
        "    groups: [gpu]",
        "    groups: [gpu, dgx]",
        ["inventory/hosts.yaml:8:19: boxes.spark.groups[1]: group 'dgx' is not in group_order"],
    ),
    (
        "inventory_bad_port",
        "inventory/hosts.yaml",
        "    ssh_user: lobes\n  spark",
        "    ssh_user: lobes\n    ssh_port: 70000\n  spark",
        [
            "inventory/hosts.yaml:7:5: boxes.thor.ssh_port: input should be less than or equal to 65535 (got 70000)"
        ],
    ),
    (
        "override_not_last",
        "group_vars/all.yaml",
        "[docker-compose.yml, docker-compose.override.yml]",
        "[docker-compose.yml, docker-compose.override.yml, docker-compose.shape.yml]",
        [
            "group_vars/all.yaml:4:39: deployment.compose_files[1]: lobes always puts docker-compose.override.yml last"
        ],
    ),
    (
        "chain_not_list",
        "group_vars/all.yaml",
        "[docker-compose.yml, docker-compose.override.yml]",
        "docker-compose.yml",
        [
            "group_vars/all.yaml:4:3: deployment.compose_files: expected a list, got str 'docker-compose.yml'"
        ],
    ),
    (
        "tagged_image_without_reason",
        "group_vars/all.yaml",
        "  vllm: vllm/vllm-openai@sha256:3fb023cc987cc7c2bca7ca14c1e0aff5ae06bd9431bf07773731ce7e8a682460",
        "  vllm: {ref: 'nvcr.io/nvidia/vllm:26.04-py3'}",
        ["group_vars/all.yaml:6:3: images.vllm.tag_allowed_because: required key is missing"],
    ),
    (
        "shared_image_var_conflict",
        "group_vars/spark.yaml",
        "    role: cortex\n    image: vllm",
        "    role: cortex\n    image: vllm/vllm-openai@sha256:2222222222222222222222222222222222222222222222222222222222222222",
        [
            "group_vars/spark.yaml:7:5: lanes.cortex.image: lanes 'embed' and 'cortex' share VLLM_NIGHTLY_IMAGE but want different images"
        ],
    ),
    (
        "missing_required",
        "group_vars/spark.yaml",
        "  shape: spark-lobe\n",
        "",
        ["group_vars/spark.yaml:1:1: lobes.shape: required key is missing"],
    ),
    (
        "bool_for_string_env_ok_but_dict",
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        "  VLLM_GDN_DECODE_KERNEL: {kernel: triton}",
        [
            "group_vars/thor.yaml:5:3: env.VLLM_GDN_DECODE_KERNEL.secret: required key is missing",
            "group_vars/thor.yaml:5:28: env.VLLM_GDN_DECODE_KERNEL.kernel: unknown key (valid keys: secret)",
        ],
    ),
    (
        "proxy_to_self",
        "group_vars/spark.yaml",
        "  worker: {proxied_to: thor}",
        "  worker: {proxied_to: spark}",
        [
            "group_vars/spark.yaml:12:12: contract.worker.proxied_to: 'worker' cannot be proxied to the box itself"
        ],
    ),
    (
        "mesh_keys_differ",
        "group_vars/spark.yaml",
        "contract:",
        "secrets:\n  other_key: {source: controller_env, variable: OTHER_KEY}\nmesh:\n  key: {secret: other_key}\ncontract:",
        [
            "group_vars/all.yaml:24:3: mesh.key: mesh key secrets differ: ['mesh_key', 'other_key']",
            "group_vars/spark.yaml:13:3: mesh.key: mesh key secrets differ: ['mesh_key', 'other_key']",
        ],
    ),
    (
        "env_value_list",
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        "  VLLM_GDN_DECODE_KERNEL: [triton, cuda]",
        [
            "group_vars/thor.yaml:5:3: env.VLLM_GDN_DECODE_KERNEL: expected a bool, a number, an integer, a {secret: NAME} or a string, got list ['triton', 'cuda']"
        ],
    ),
    (
        "lanes_not_mapping",
        "group_vars/spark.yaml",
        "lanes:\n  cortex:",
        "lanes: cortex\nx_lanes:\n  cortex:",
        [
            "group_vars/spark.yaml:4:1: lanes: expected a mapping, got str 'cortex'",
            "group_vars/spark.yaml:5:1: x_lanes: unknown key; did you mean 'lanes'?",
        ],
    ),
    (
        "secret_ref_without_pattern",
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        "  VLLM_GDN_DECODE_KERNEL: {secret: mesh_key}",
        [
            "group_vars/thor.yaml:5:3: env.VLLM_GDN_DECODE_KERNEL: VLLM_GDN_DECODE_KERNEL takes a secret but matches no secret_patterns; add a pattern"
        ],
    ),
    (
        "tagged_image_already_digest",
        "group_vars/all.yaml",
        "  vllm: vllm/vllm-openai@sha256:3fb023cc987cc7c2bca7ca14c1e0aff5ae06bd9431bf07773731ce7e8a682460",
        "  vllm: {ref: 'vllm/vllm-openai@sha256:3fb023cc987cc7c2bca7ca14c1e0aff5ae06bd9431bf07773731ce7e8a682460', tag_allowed_because: 'no reason at all'}",
        [
            "group_vars/all.yaml:6:10: images.vllm.ref: is pinned by digest; drop tag_allowed_because"
        ],
    ),
    (
        "gateway_image_tag",
        "group_vars/all.yaml",
        "  image: gateway",
        "  image: lobes-gateway:worker",
        [
            "group_vars/all.yaml:19:3: gateway.image: 'lobes-gateway:worker' is not pinned by digest (want repo@sha256:<64 hex>)"
        ],
    ),
    (
        "bind_not_ip",
        "group_vars/all.yaml",
        "  auth: keyed",
        "  bind: everywhere\n  auth: keyed",
        ["group_vars/all.yaml:20:3: gateway.bind: 'everywhere' is not an IPv4 address"],
    ),
    (
        "unknown_box_key_inventory",
        "inventory/hosts.yaml",
        "    ssh_user: lobes\n  spark",
        "    ssh_usr: lobes\n  spark",
        ["inventory/hosts.yaml:6:5: boxes.thor.ssh_usr: unknown key; did you mean 'ssh_user'?"],
    ),
    (
        "tab_indent",
        "group_vars/jetson.yaml",
        "  mem_available_floor_gib: 4",
        "\tmem_available_floor_gib: 4",
        [
            "group_vars/jetson.yaml:2:1: malformed YAML: found character '\\t' that cannot start any token"
        ],
    ),
    # Class 2 of issue 10: every value that reaches a command line, a path or .env is typed.
    (
        "ssh_user_proxycommand",
        "inventory/hosts.yaml",
        "    ssh_user: lobes\n  spark",
        '    ssh_user: "-oProxyCommand=touch /tmp/x"\n  spark',
        [
            "inventory/hosts.yaml:6:5: boxes.thor.ssh_user: '-oProxyCommand=touch /tmp/x' is not a POSIX user name (a lowercase letter or _, then up to 31 of a-z, 0-9, _ and -)",
        ],
    ),
    (
        "ssh_user_dollar_suffix",
        "inventory/hosts.yaml",
        "    ssh_user: lobes\n  spark",
        '    ssh_user: "lobes$"\n  spark',
        [
            "inventory/hosts.yaml:6:5: boxes.thor.ssh_user: 'lobes$' is not a POSIX user name (a lowercase letter or _, then up to 31 of a-z, 0-9, _ and -)",
        ],
    ),
    (
        "ssh_user_with_host",
        "inventory/hosts.yaml",
        "    ssh_user: lobes\n  spark",
        "    ssh_user: root@evil.example\n  spark",
        [
            "inventory/hosts.yaml:6:5: boxes.thor.ssh_user: 'root@evil.example' is not a POSIX user name (a lowercase letter or _, then up to 31 of a-z, 0-9, _ and -)",
        ],
    ),
    (
        "ssh_hostname_option",
        "inventory/hosts.yaml",
        "ssh_hostname: 10.0.0.11",
        'ssh_hostname: "-oProxyCommand=touch /tmp/x"',
        [
            "inventory/hosts.yaml:5:5: boxes.thor.ssh_hostname: '-oProxyCommand=touch /tmp/x' is not a host name (dot-separated labels of letters, digits and inner -) or an IP address",
        ],
    ),
    (
        "ssh_hostname_octal",
        "inventory/hosts.yaml",
        "ssh_hostname: 10.0.0.11",
        "ssh_hostname: 10.0.0.011",
        [
            "inventory/hosts.yaml:5:5: boxes.thor.ssh_hostname: '10.0.0.011' is not a host name: the resolver reads it as an IPv4 address (hex, octal or short form); write the address as four decimal numbers (a.b.c.d)",
        ],
    ),
    (
        "ssh_hostname_spaces",
        "inventory/hosts.yaml",
        "ssh_hostname: 10.0.0.11",
        'ssh_hostname: "thor.lan -p 2222"',
        [
            "inventory/hosts.yaml:5:5: boxes.thor.ssh_hostname: 'thor.lan -p 2222' is not a host name (dot-separated labels of letters, digits and inner -) or an IP address",
        ],
    ),
    (
        "ssh_key_option",
        "inventory/hosts.yaml",
        "    ssh_user: lobes\n  spark",
        '    ssh_user: lobes\n    ssh_key: "-oProxyCommand=x"\n  spark',
        [
            "inventory/hosts.yaml:7:5: boxes.thor.ssh_key: '-oProxyCommand=x' is not a plain file path (letters, digits and . _ / ~ + -, not starting with -): ssh would parse anything else",
        ],
    ),
    (
        "ssh_known_hosts_two_files",
        "inventory/hosts.yaml",
        "    ssh_user: lobes\n  spark",
        '    ssh_user: lobes\n    ssh_known_hosts_file: "kh /etc/ssh/evil"\n  spark',
        [
            "inventory/hosts.yaml:7:5: boxes.thor.ssh_known_hosts_file: 'kh /etc/ssh/evil' is not a plain file path (letters, digits and . _ / ~ + -, not starting with -): ssh would parse anything else",
        ],
    ),
    (
        "ssh_key_percent_token",
        "inventory/hosts.yaml",
        "    ssh_user: lobes\n  spark",
        '    ssh_user: lobes\n    ssh_key: "keys/%u"\n  spark',
        [
            "inventory/hosts.yaml:7:5: boxes.thor.ssh_key: 'keys/%u' is not a plain file path (letters, digits and . _ / ~ + -, not starting with -): ssh would parse anything else",
        ],
    ),
    (
        "gateway_origin_credentials",
        "inventory/hosts.yaml",
        "    ssh_user: lobes\n  spark",
        '    ssh_user: lobes\n    gateway_origin: "http://mesh:hunter2@10.0.0.11:8000"\n  spark',
        [
            "inventory/hosts.yaml:7:5: boxes.thor.gateway_origin: must be http://HOST[:PORT] or https://HOST[:PORT], nothing more; credentials (user@) never go in an origin",
        ],
    ),
    (
        "gateway_origin_second_seed",
        "inventory/hosts.yaml",
        "    ssh_user: lobes\n  spark",
        '    ssh_user: lobes\n    gateway_origin: "http://10.0.0.11:8000,http://evil.example:80"\n  spark',
        [
            "inventory/hosts.yaml:7:5: boxes.thor.gateway_origin: 'http://10.0.0.11:8000,http://evil.example:80' must be http://HOST[:PORT] or https://HOST[:PORT], nothing more",
        ],
    ),
    (
        "gateway_origin_path",
        "inventory/hosts.yaml",
        "    ssh_user: lobes\n  spark",
        '    ssh_user: lobes\n    gateway_origin: "http://10.0.0.11:8000/../admin"\n  spark',
        [
            "inventory/hosts.yaml:7:5: boxes.thor.gateway_origin: 'http://10.0.0.11:8000/../admin' must be http://HOST[:PORT] or https://HOST[:PORT], nothing more",
        ],
    ),
    (
        "gateway_origin_scheme",
        "inventory/hosts.yaml",
        "    ssh_user: lobes\n  spark",
        '    ssh_user: lobes\n    gateway_origin: "file:///etc/passwd"\n  spark',
        [
            "inventory/hosts.yaml:7:5: boxes.thor.gateway_origin: 'file:///etc/passwd' must be http://HOST[:PORT] or https://HOST[:PORT], nothing more",
        ],
    ),
    (
        "gateway_origin_port",
        "inventory/hosts.yaml",
        "    ssh_user: lobes\n  spark",
        '    ssh_user: lobes\n    gateway_origin: "https://thor.lan:99999"\n  spark',
        [
            "inventory/hosts.yaml:7:5: boxes.thor.gateway_origin: 'https://thor.lan:99999' must be http://HOST[:PORT] or https://HOST[:PORT], nothing more; port 99999 is not in 1-65535",
        ],
    ),
    (
        "image_overlay_newline",
        "inventory/hosts.yaml",
        "boxes:\n",
        'image_overlay: "a\\nb.yaml"\nboxes:\n',
        [
            "inventory/hosts.yaml:2:1: image_overlay: a file path cannot contain a line feed",
        ],
    ),
    (
        "directory_escapes_home",
        "group_vars/all.yaml",
        "deployment:\n",
        "deployment:\n  directory: ~/../../etc\n",
        [
            "group_vars/all.yaml:4:3: deployment.directory: '~/../../etc' has a .. component: it must stay inside the home",
        ],
    ),
    (
        "directory_absolute",
        "group_vars/all.yaml",
        "deployment:\n",
        "deployment:\n  directory: /etc\n",
        [
            "group_vars/all.yaml:4:3: deployment.directory: '/etc' is absolute: write it inside the deploy user's home as ~/...",
        ],
    ),
    (
        "secret_path_other_home",
        "group_vars/all.yaml",
        "path: ~/.lobes/.secrets.env",
        "path: ~root/.ssh/id_ed25519",
        [
            "group_vars/all.yaml:9:39: secrets.gateway_api_key.path: the value (not shown: under secrets:, 21 characters) names another user's home: only ~ or ~/... is allowed",
        ],
    ),
    (
        "secret_path_absolute",
        "group_vars/all.yaml",
        "path: ~/.lobes/.secrets.env",
        "path: /etc/shadow",
        [
            "group_vars/all.yaml:9:39: secrets.gateway_api_key.path: the value (not shown: under secrets:, 11 characters) is absolute: write it inside the deploy user's home as ~/...",
        ],
    ),
    (
        "secret_path_newline",
        "group_vars/all.yaml",
        "path: ~/.lobes/.secrets.env",
        'path: "~/.lobes/.secrets.env\\n"',
        [
            "group_vars/all.yaml:9:39: secrets.gateway_api_key.path: a path cannot contain a line feed",
        ],
    ),
    (
        "env_value_newline",
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        '  VLLM_GDN_DECODE_KERNEL: "triton\\nGATEWAY_API_KEY=stolen"',
        [
            "group_vars/thor.yaml:5:3: env.VLLM_GDN_DECODE_KERNEL: an .env value cannot contain a line feed (the value is not shown)",
        ],
    ),
    (
        "lane_env_value_cr",
        "group_vars/thor.yaml",
        "      WORKER_MAX_NUM_SEQS: 1",
        '      WORKER_MAX_NUM_SEQS: "1\\r"',
        [
            "group_vars/thor.yaml:14:7: lanes.worker.env.WORKER_MAX_NUM_SEQS: an .env value cannot contain a carriage return (the value is not shown)",
        ],
    ),
    (
        "secret_literal_newline_not_echoed",
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        '  HF_TOKEN: "hf_abcdef123456\\n"',
        [
            "group_vars/thor.yaml:5:3: env.HF_TOKEN: invalid value (value not shown: a secret-named key)",
        ],
    ),
    (
        "model_newline",
        "group_vars/spark.yaml",
        "    role: cortex\n",
        '    role: cortex\n    model: "Qwen/Qwen3\\nGATEWAY_API_KEY=x"\n',
        [
            "group_vars/spark.yaml:7:5: lanes.cortex.model: the value (not shown: it may carry a secret, 28 characters) is not a model id (name or namespace/name: letters, digits, . _ -, no -- or ..)",
        ],
    ),
    (
        "model_path",
        "group_vars/spark.yaml",
        "    role: cortex\n",
        "    role: cortex\n    model: ../../root/.ssh\n",
        [
            "group_vars/spark.yaml:7:5: lanes.cortex.model: '../../root/.ssh' is not a model id (name or namespace/name: letters, digits, . _ -, no -- or ..)",
        ],
    ),
    (
        "served_name_option",
        "group_vars/spark.yaml",
        "    role: cortex\n",
        '    role: cortex\n    served_name: "--trust-remote-code"\n',
        [
            "group_vars/spark.yaml:7:5: lanes.cortex.served_name: '--trust-remote-code' is not a model id (name or namespace/name: letters, digits, . _ -, no -- or ..)",
        ],
    ),
    (
        "tagged_image_bad_reference",
        "group_vars/all.yaml",
        "  vllm: vllm/vllm-openai@sha256:3fb023cc987cc7c2bca7ca14c1e0aff5ae06bd9431bf07773731ce7e8a682460",
        "  vllm: {ref: 'nvcr.io/nvidia/vllm:26.04 --privileged', tag_allowed_because: 'no digest is published'}",
        [
            "group_vars/all.yaml:6:10: images.vllm.ref: 'nvcr.io/nvidia/vllm:26.04 --privileged' is not an image reference ([registry[:port]/]path[:tag][@digest], lowercase path)",
        ],
    ),
    (
        "tagged_image_uppercase_path",
        "group_vars/all.yaml",
        "  vllm: vllm/vllm-openai@sha256:3fb023cc987cc7c2bca7ca14c1e0aff5ae06bd9431bf07773731ce7e8a682460",
        "  vllm: {ref: 'nvcr.io/NVIDIA/vllm:26.04', tag_allowed_because: 'no digest is published'}",
        [
            "group_vars/all.yaml:6:10: images.vllm.ref: 'nvcr.io/NVIDIA/vllm:26.04' is not an image reference ([registry[:port]/]path[:tag][@digest], lowercase path)",
        ],
    ),
    (
        "digest_ref_newline",
        "group_vars/all.yaml",
        "  vllm: vllm/vllm-openai@sha256:3fb023cc987cc7c2bca7ca14c1e0aff5ae06bd9431bf07773731ce7e8a682460",
        '  vllm: "vllm/vllm-openai@sha256:3fb023cc987cc7c2bca7ca14c1e0aff5ae06bd9431bf07773731ce7e8a682460\\n"',
        [
            "group_vars/all.yaml:6:3: images.vllm: 'vllm/vllm-openai@sha256:3fb023cc987cc7c2bca7ca14c1e0aff5ae06bd9431bf07773731ce7e8a682460\\n' is not pinned by digest (want repo@sha256:<64 hex>)",
        ],
    ),
    (
        "lane_image_option",
        "group_vars/thor.yaml",
        "    image: vllm\n    profile",
        '    image: "--privileged"\n    profile',
        [
            "group_vars/thor.yaml:9:5: lanes.worker.image: '--privileged' is neither a name from images: nor an image reference ([registry[:port]/]path[:tag][@digest])",
        ],
    ),
    (
        "compose_file_path",
        "group_vars/all.yaml",
        "[docker-compose.yml, docker-compose.override.yml]",
        "[docker-compose.yml, ../../etc/x.yml, docker-compose.override.yml]",
        [
            "group_vars/all.yaml:4:39: deployment.compose_files[1]: '../../etc/x.yml' is not a compose file name (letters, digits, _ . -, ending in .yml or .yaml, no /)",
        ],
    ),
    (
        "file_digest_key_path",
        "group_vars/all.yaml",
        "deployment:\n",
        "deployment:\n  file_digests:\n    ../../etc/cron.d/x.yml: 3fb023cc987cc7c2bca7ca14c1e0aff5ae06bd9431bf07773731ce7e8a682460\n",
        [
            "group_vars/all.yaml:5:5: deployment.file_digests.../../etc/cron.d/x.yml: '../../etc/cron.d/x.yml' is not a compose file name (letters, digits, _ . -, ending in .yml or .yaml, no /)",
        ],
    ),
    (
        "forbidden_glob_shell",
        "group_vars/all.yaml",
        '  forbidden: [GATEWAY_API_KEY, "*_MAX_MODEL_LEN"]',
        '  forbidden: [GATEWAY_API_KEY, "$(touch /tmp/x)"]',
        [
            "group_vars/all.yaml:13:32: login_shell.forbidden[1]: '$(touch /tmp/x)' is not a glob of variable names (letters, digits, _ and * ? [ ] ! -)",
        ],
    ),
    (
        "secret_pattern_glob_space",
        "group_vars/all.yaml",
        'secret_patterns: ["*_KEY", "*_TOKEN"]',
        'secret_patterns: ["*_KEY", "*_TOKEN x"]',
        [
            "group_vars/all.yaml:11:28: secret_patterns[1]: '*_TOKEN x' is not a glob of variable names (letters, digits, _ and * ? [ ] ! -)",
        ],
    ),
    (
        "version_other_digits",
        "group_vars/all.yaml",
        '  version: "0.91.0"',
        '  version: "٠.٩١.٠"',
        [
            "group_vars/all.yaml:2:3: lobes.version: '٠.٩١.٠' is not a version MAJOR.MINOR.PATCH (digits only)",
        ],
    ),
    (
        "bind_octet_out_of_range",
        "group_vars/all.yaml",
        "  auth: keyed",
        "  bind: 999.1.1.1\n  auth: keyed",
        [
            "group_vars/all.yaml:20:3: gateway.bind: '999.1.1.1' is not an IPv4 address",
        ],
    ),
    # -- review fixes (tests/unit/test_desired_review_fixes.py): line breaks, overlays, `name`,
    # the box's own bounds, numbers rewritten on their way to `.env`, hex hosts, model shapes
    (
        "env_value_line_separator",
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        '  VLLM_GDN_DECODE_KERNEL: triton\n  FOO_MODE: "x\\LGATEWAY_API_KEY=\\Pbar"',
        [
            "group_vars/thor.yaml:6:3: env.FOO_MODE: an .env value cannot contain a line separator (U+2028) (the value is not shown)",
        ],
    ),
    (
        "lane_env_paragraph_separator",
        "group_vars/thor.yaml",
        "      WORKER_MAX_NUM_SEQS: 1",
        '      WORKER_MAX_NUM_SEQS: "1\\P"',
        [
            "group_vars/thor.yaml:14:7: lanes.worker.env.WORKER_MAX_NUM_SEQS: an .env value cannot contain a paragraph separator (U+2029) (the value is not shown)",
        ],
    ),
    (
        "reason_line_separator",
        "group_vars/all.yaml",
        "  vllm: vllm/vllm-openai@sha256:3fb023cc987cc7c2bca7ca14c1e0aff5ae06bd9431bf07773731ce7e8a682460",
        "  vllm: {ref: 'nvcr.io/nvidia/vllm:26.04', tag_allowed_because: \"no digest\\Lis published\"}",
        [
            "group_vars/all.yaml:6:44: images.vllm.tag_allowed_because: text shown in reports cannot contain a line separator (U+2028)",
        ],
    ),
    (
        "secret_path_line_separator",
        "group_vars/all.yaml",
        "path: ~/.lobes/.secrets.env",
        'path: "~/.lobes/.secrets\\L.env"',
        [
            "group_vars/all.yaml:9:39: secrets.gateway_api_key.path: a path cannot contain a line separator (U+2028)",
        ],
    ),
    (
        "env_key_line_separator",
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        '  VLLM_GDN_DECODE_KERNEL: triton\n  "FOO\\L": x',
        [
            "group_vars/thor.yaml:6:3: env: line separator U+2028 is not allowed in a key",
        ],
    ),
    (
        "layer_sets_name_unknown",
        "group_vars/thor.yaml",
        "lobes:\n",
        "name: ghost\nlobes:\n",
        [
            "group_vars/thor.yaml:1:1: name: a layer cannot set name: the inventory names each box (its key under boxes:)",
        ],
    ),
    (
        "layer_sets_name_other_box",
        "group_vars/jetson.yaml",
        "memory:\n",
        "name: thor\nmemory:\n",
        [
            "group_vars/jetson.yaml:1:1: name: a layer cannot set name: the inventory names each box (its key under boxes:)",
        ],
    ),
    (
        "directory_is_home",
        "group_vars/all.yaml",
        "deployment:\n",
        "deployment:\n  directory: ~/\n",
        [
            "group_vars/all.yaml:4:3: deployment.directory: the home itself (~) is not a path inside it: write ~/...",
        ],
    ),
    (
        "secret_path_is_home",
        "group_vars/all.yaml",
        "path: ~/.lobes/.secrets.env",
        "path: ~/.",
        [
            "group_vars/all.yaml:9:39: secrets.gateway_api_key.path: the home itself (~) is not a path inside it: write ~/...",
        ],
    ),
    (
        "boot_timeout_over_a_week",
        "group_vars/gpu.yaml",
        "    boot_timeout_s: 900",
        "    boot_timeout_s: 604801",
        [
            "group_vars/gpu.yaml:3:5: lanes.embed.boot_timeout_s: input should be less than or equal to 604800 (got 604801)",
        ],
    ),
    (
        "health_timeout_over_a_week",
        "group_vars/all.yaml",
        "  auth: keyed",
        "  health_timeout_s: 1000000\n  auth: keyed",
        [
            "group_vars/all.yaml:20:3: gateway.health_timeout_s: input should be less than or equal to 604800 (got 1000000)",
        ],
    ),
    (
        "floor_over_box_bound",
        "group_vars/jetson.yaml",
        "  mem_available_floor_gib: 4",
        "  mem_available_floor_gib: 2000000",
        [
            "group_vars/jetson.yaml:2:3: memory.mem_available_floor_gib: input should be less than or equal to 1048576 (got 2000000)",
        ],
    ),
    (
        "env_value_quote_and_dollar",
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        '  VLLM_GDN_DECODE_KERNEL: "it\'s $HOME"',
        [
            "group_vars/thor.yaml:5:3: env.VLLM_GDN_DECODE_KERNEL: an .env value cannot hold both ' and $: no quoting makes compose read it back unchanged (the value is not shown)",
        ],
    ),
    (
        "env_number_leading_zeros",
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        "  VLLM_GDN_DECODE_KERNEL: triton\n  APP_UMASK: 0022",
        [
            "group_vars/thor.yaml:6:3: env.APP_UMASK: read as a number or boolean, this reaches .env as other text than it is written (0022 as 22, 1_000 as 1000, 0x10 as 16, 1e3 as 1000.0, TRUE as true): quote it to keep the text",
        ],
    ),
    (
        "env_number_underscore",
        "group_vars/thor.yaml",
        "      WORKER_MAX_NUM_SEQS: 1",
        "      WORKER_MAX_NUM_SEQS: 1_000",
        [
            "group_vars/thor.yaml:14:7: lanes.worker.env.WORKER_MAX_NUM_SEQS: read as a number or boolean, this reaches .env as other text than it is written (0022 as 22, 1_000 as 1000, 0x10 as 16, 1e3 as 1000.0, TRUE as true): quote it to keep the text",
        ],
    ),
    (
        "env_number_hex",
        "group_vars/thor.yaml",
        "      WORKER_MAX_NUM_SEQS: 1",
        "      WORKER_MAX_NUM_SEQS: 0x10",
        [
            "group_vars/thor.yaml:14:7: lanes.worker.env.WORKER_MAX_NUM_SEQS: read as a number or boolean, this reaches .env as other text than it is written (0022 as 22, 1_000 as 1000, 0x10 as 16, 1e3 as 1000.0, TRUE as true): quote it to keep the text",
        ],
    ),
    (
        "env_number_exponent",
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        "  VLLM_GDN_DECODE_KERNEL: 1e3",
        [
            "group_vars/thor.yaml:5:3: env.VLLM_GDN_DECODE_KERNEL: read as a number or boolean, this reaches .env as other text than it is written (0022 as 22, 1_000 as 1000, 0x10 as 16, 1e3 as 1000.0, TRUE as true): quote it to keep the text",
        ],
    ),
    (
        "env_number_octal_looking",
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        "  VLLM_GDN_DECODE_KERNEL: 010",
        [
            "group_vars/thor.yaml:5:3: env.VLLM_GDN_DECODE_KERNEL: read as a number or boolean, this reaches .env as other text than it is written (0022 as 22, 1_000 as 1000, 0x10 as 16, 1e3 as 1000.0, TRUE as true): quote it to keep the text",
        ],
    ),
    (
        "env_boolean_capitalized",
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        "  VLLM_GDN_DECODE_KERNEL: TRUE",
        [
            "group_vars/thor.yaml:5:3: env.VLLM_GDN_DECODE_KERNEL: read as a number or boolean, this reaches .env as other text than it is written (0022 as 22, 1_000 as 1000, 0x10 as 16, 1e3 as 1000.0, TRUE as true): quote it to keep the text",
        ],
    ),
    (
        "host_hex_dotted",
        "inventory/hosts.yaml",
        "ssh_hostname: 10.0.0.11",
        "ssh_hostname: 0x0a.0x00.0x00.0x01",
        [
            "inventory/hosts.yaml:5:5: boxes.thor.ssh_hostname: '0x0a.0x00.0x00.0x01' is not a host name: the resolver reads it as an IPv4 address (hex, octal or short form); write the address as four decimal numbers (a.b.c.d)",
        ],
    ),
    (
        "host_hex_number",
        "inventory/hosts.yaml",
        "ssh_hostname: 10.0.0.12",
        'ssh_hostname: "0x7f000001"',
        [
            "inventory/hosts.yaml:9:5: boxes.spark.ssh_hostname: '0x7f000001' is not a host name: the resolver reads it as an IPv4 address (hex, octal or short form); write the address as four decimal numbers (a.b.c.d)",
        ],
    ),
    (
        "model_key_null",
        "group_vars/jetson.yaml",
        "memory:\n",
        "login_shell: null\nmemory:\n",
        [
            "group_vars/jetson.yaml:1:1: login_shell: expected a mapping {forbidden: ...}, got null None",
        ],
    ),
    (
        "model_key_list",
        "group_vars/jetson.yaml",
        "memory:\n  mem_available_floor_gib: 4",
        "memory: [4]",
        [
            "group_vars/jetson.yaml:1:1: memory: expected a mapping {drop_caches_before_boot: ..., mem_available_floor_gib: ...}, got list [4]",
        ],
    ),
]
