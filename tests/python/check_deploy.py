"""Checks of the deployment files with the real tools (helm, kubernetes-validate) and our own rules.

Usage: check_deploy.py REPO_ROOT  →  JSON on stdout:
  {"problems": [...], "env": {stage: {"KEY": "value" | null}}, "binaries": [...], "targets": [...],
   "rendered": {values_file: object_count}, "runs": {stage: binary}}

- docker-compose.yml, Chart.yaml and the values files parse as YAML; compose publishes no host
  port twice;
- every chart template has balanced actions (`{{ }}`) and blocks, and every `.Values.x.y` /
  `$stage.x` a template reads is defined (Helm renders an undefined value as empty, silently);
- `helm lint` and `helm template` with values.yaml, values-production.yaml and
  ci/everything-values.yaml (every optional part on); every rendered object validated in strict
  mode against the Kubernetes schemas of KUBERNETES_VERSIONS (oldest and newest checked);
- our rules on the rendered objects: every pod runs as non-root with seccomp RuntimeDefault, a
  read-only root, no service-account token and no privilege escalation; every path a stage
  writes (state, checkpoints) is on a mounted volume; every Secret reference names the chart's
  Secret; ingest gets the producers' tokens and the admin tokens apart, the other stages only the
  admin tokens; the `helm test` pod sends one token; a NetworkPolicy selects every stage;
- values the chart must refuse (auth on with no tokens, one token in both sets, an Ingress without
  TLS) fail `helm template` with a message naming the value;
- the CONTRAIL_* variables each stage gets — from docker-compose.yml and from the rendered
  workloads — are collected per stage; the Rust side runs every stage binary with them
  (`--print-config`), which fails on any key its config does not have;
- the Dockerfile's build targets and the binaries it builds.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import yaml

STAGES = ["ingest", "dedup-state", "cosmos-writer", "changefeed-sync", "delta-archiver"]
# Deployments of the knock-on delay extension: a stage's binary with other settings.
EXTENSIONS = {"rotation": "dedup-state", "cosmos-predictions": "cosmos-writer"}
COMPONENTS = STAGES + list(EXTENSIONS)
# The oldest Kubernetes minor we support (AKS long-term support line) and the newest schema here.
KUBERNETES_VERSIONS = ["1.30.0", "1.37.0"]
VALUES_FILES = ["values.yaml", "values-production.yaml", "ci/everything-values.yaml", "ci/no-auth-values.yaml"]
# Files that set every stage's every key (the CI overlay sets only what it switches on).
COMPLETE_VALUES = ["values.yaml", "values-production.yaml"]
# Values the chart must refuse to render, with words the error must contain.
REFUSED = [
    ({"secrets": {"create": True}}, "secrets.ingestTokens"),
    ({"secrets": {"create": True, "ingestTokens": "a\nb \r\n", "adminTokens": "c\nb\n"}}, "share a token"),
    ({"ingress": {"enabled": True}}, "ingress.tls.secretName"),
]


def main() -> None:
    root = pathlib.Path(sys.argv[1])
    problems: list[str] = []
    env: dict[str, dict[str, str | None]] = {stage: {} for stage in STAGES}

    def load(path: pathlib.Path):
        try:
            return yaml.safe_load(path.read_text())
        except Exception as error:  # noqa: BLE001 - reported, not raised
            problems.append(f"{path}: not YAML: {error}")
            return None

    compose = load(root / "docker-compose.yml") or {}
    chart_dir = root / "deploy/helm/contrail"
    chart = load(chart_dir / "Chart.yaml") or {}
    values = {name: load(chart_dir / name) or {} for name in VALUES_FILES}
    for key in ["apiVersion", "name", "version", "appVersion"]:
        if key not in chart:
            problems.append(f"Chart.yaml has no {key}")

    # Compose: every stage is a service built from the Dockerfile's target of the same name.
    services = compose.get("services", {})
    for stage in STAGES:
        service = services.get(stage)
        if service is None:
            problems.append(f"docker-compose.yml has no service {stage}")
            continue
        build = service.get("build", {})
        if build.get("target") != stage or build.get("dockerfile") != "deploy/docker/Dockerfile":
            problems.append(f"docker-compose.yml: {stage} is not built from deploy/docker/Dockerfile target {stage}")
        for key, value in (service.get("environment") or {}).items():
            if key.startswith("CONTRAIL_"):
                env[stage][key] = str(value)
    for dependency in ["broker", "cosmos", "azurite"]:
        if dependency not in services:
            problems.append(f"docker-compose.yml has no {dependency} service")

    # Templates.
    templates = sorted((chart_dir / "templates").rglob("*"))
    values_paths = re.compile(r"\.Values\.([A-Za-z0-9_.]+)")
    stage_paths = re.compile(r"\$stage\.([A-Za-z0-9_.]+)")
    opener = re.compile(r"{{-?\s*(if|range|with|define)\b")
    closer = re.compile(r"{{-?\s*end\s*-?}}")
    for template in templates:
        if not template.is_file():
            continue
        text = template.read_text()
        if text.count("{{") != text.count("}}"):
            problems.append(f"{template.name}: unbalanced {{{{ }}}}")
        opened, closed = len(opener.findall(text)), len(closer.findall(text))
        if opened != closed:
            problems.append(f"{template.name}: {opened} blocks opened, {closed} closed")
        # Helm merges a values file over values.yaml: the defaults must define everything read.
        for path in values_paths.findall(text):
            if not has_path(values["values.yaml"], path):
                problems.append(f"{template.name} reads .Values.{path}, missing in values.yaml")
        for path in stage_paths.findall(text):
            for name, tree in values.items():
                if name not in COMPLETE_VALUES:
                    continue
                for stage, settings in (tree.get("stages") or {}).items():
                    only_stateful = path.split(".")[0] in ("checkpoints", "persistence")
                    if only_stateful and settings.get("binary") != "dedup-state":
                        continue
                    # Read only inside `if $stage.autoscaling.enabled`.
                    hpa_off = not (settings.get("autoscaling") or {}).get("enabled")
                    if path.startswith("autoscaling.") and path != "autoscaling.enabled" and hpa_off:
                        continue
                    if not has_path(settings, path):
                        problems.append(f"{template.name} reads $stage.{path}, missing in {name} stages.{stage}")
    # Every value the production file sets is a value of the chart (no typos that Helm would ignore).
    free_form = ("annotations", "labels", "env", "nodeSelector", "affinity", "tolerations", "resources")
    for name in VALUES_FILES[1:]:
        for path in leaf_paths(values[name], free_form):
            if not has_path(values["values.yaml"], path) and not re.match(r"stages\.[^.]+\.autoscaling\.", path):
                problems.append(f"{name} sets {path}, which values.yaml does not define")

    # Real tools: lint, render, validate against the Kubernetes schemas, then our rules.
    rendered_counts: dict[str, int] = {}
    for values_file in VALUES_FILES:
        objects = render(chart_dir, values_file, problems)
        rendered_counts[values_file] = len(objects)
        if not objects:
            continue
        validate_schemas(objects, values_file, problems)
        check_objects(objects, values_file, values, problems)
        for stage, stage_env in workload_env(objects).items():
            for key, value in stage_env.items():
                env.setdefault(stage, {}).setdefault(key, value)
    for overrides, expected in REFUSED:
        refused(chart_dir, overrides, expected, problems)
    for name, tree in values.items():
        for stage, settings in (tree.get("stages") or {}).items():
            if stage not in COMPONENTS:
                problems.append(f"{name}: unknown stage {stage}")
                continue
            wanted_binary = EXTENSIONS.get(stage, stage)
            if name in COMPLETE_VALUES and settings.get("binary") != wanted_binary:
                problems.append(f"{name}: stages.{stage}.binary is {settings.get('binary')!r}, not {wanted_binary!r}")
            if name == "values-production.yaml" and set(settings) != set(values["values.yaml"]["stages"][stage]):
                missing = set(values["values.yaml"]["stages"][stage]) - set(settings)
                if missing:
                    problems.append(f"{name}: stages.{stage} lacks {sorted(missing)}")
            for key in settings.get("env") or {}:
                if not key.startswith("CONTRAIL_"):
                    problems.append(f"{name}: stages.{stage}.env.{key} is not a CONTRAIL_ setting")

    problems.extend(check_monitoring(root, chart_dir))

    # Compose: no host port published twice.
    published: dict[str, str] = {}
    for service_name, service in services.items():
        for mapping in service.get("ports") or []:
            host = str(mapping).rsplit(":", 1)[0]
            if host in published:
                problems.append(f"docker-compose.yml: host port {host} published by {published[host]} and {service_name}")
            published[host] = service_name

    # The Dockerfile.
    dockerfile = (root / "deploy/docker/Dockerfile").read_text()
    targets = re.findall(r"^FROM \S+ AS (\S+)", dockerfile, re.MULTILINE)
    binaries = sorted(set(re.findall(r"--bin (\S+)", dockerfile)))
    for stage in STAGES:
        if stage not in targets:
            problems.append(f"Dockerfile has no target {stage}")
        if f"COPY --from=build /out/{stage} /usr/local/bin/{stage}" not in dockerfile:
            problems.append(f"Dockerfile target {stage} does not copy its binary")
    problems.extend(check_image_features(root, dockerfile))
    if "USER 10001" not in dockerfile:
        problems.append("Dockerfile runtime image does not switch to the non-root user")
    if not (root / ".dockerignore").is_file():
        problems.append(".dockerignore is missing")

    print(json.dumps({"problems": problems, "env": env, "binaries": binaries, "targets": targets,
                      "rendered": rendered_counts, "runs": RUNS}))


# Features that must not reach a production binary, as `cargo tree -e features` prints them.
TEST_ONLY_FEATURES = [
    'azure_data_cosmos_driver feature "__internal_in_memory_emulator"',
    'azure_data_cosmos feature "fault_injection"',
    'azure_data_cosmos_driver feature "fault_injection"',
    'contrail-cosmos feature "fault-injection"',
    'contrail-delta-archiver feature "testing"',
    'contrail-ingest feature "replay"',
]


def check_image_features(root: pathlib.Path, dockerfile: str) -> list[str]:
    """Resolves each `cargo build` of the Dockerfile with `cargo tree` (same packages and feature
    flags, normal and build edges: what that build compiles) and refuses test-only features in
    any invocation but the dev endpoint's own."""
    problems = []
    joined = dockerfile.replace("\\\n", " ")
    invocations = re.findall(r"cargo build ([^&\n]*)", joined)
    if not invocations:
        return ["Dockerfile: no cargo build found"]
    for invocation in invocations:
        invocation = " ".join(invocation.split())
        args = invocation.split()
        packages = [args[i + 1] for i, arg in enumerate(args) if arg == "-p"]
        if not packages:
            problems.append(f"Dockerfile: `cargo build {invocation}` builds no named package (-p)")
            continue
        flags = [arg for arg in args if arg in ("--no-default-features", "--all-features")]
        for i, arg in enumerate(args):
            if arg in ("--features", "-F"):
                flags += [arg, args[i + 1]]
        command = ["cargo", "tree", "--locked", "--offline", "-e", "features,normal,build", "--prefix", "none"]
        for package in packages:
            command += ["-p", package]
        # The workspace the Dockerfile builds is the repository's (a test may check a copy of the
        # deployment files elsewhere).
        workspace = pathlib.Path(__file__).resolve().parents[2]
        result = subprocess.run(command + flags, cwd=workspace, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            problems.append(f"cargo tree for `cargo build {invocation}` failed: {result.stderr.strip()}")
            continue
        dev_endpoint = packages == ["contrail-cosmos-dev"]
        if "contrail-cosmos-dev" in packages and not dev_endpoint:
            problems.append(f"Dockerfile builds cosmos-dev together with {packages}: its emulator feature would reach them")
        for feature in TEST_ONLY_FEATURES:
            if dev_endpoint and "emulator" in feature:
                continue
            if feature in result.stdout:
                problems.append(f"Dockerfile: `cargo build {invocation}` compiles {feature}")
    return problems


def exported_metrics() -> set[str]:
    """Names of the metric families the stages register (string literals in crates/*/src), and
    the series names those families expose (histograms' _bucket, _sum, _count)."""
    workspace = pathlib.Path(__file__).resolve().parents[2]
    names: set[str] = set()
    for source in workspace.glob("crates/*/src/**/*.rs"):
        names.update(re.findall(r'"(contrail_[a-z0-9_]+)"', source.read_text()))
    names = {name for name in names if not name.startswith("contrail_test_")}
    return names | {f"{name}{suffix}" for name in names for suffix in ("_bucket", "_sum", "_count")}


def check_monitoring(root: pathlib.Path, chart_dir: pathlib.Path) -> list[str]:
    """promtool checks and unit-tests the shipped rules; every contrail_* series the rules and the
    dashboard read is one the stages export."""
    problems = []
    files = chart_dir / "files"
    for args in (["check", "rules", "prometheus-rules.yaml"], ["test", "rules", "prometheus-rules.test.yaml"]):
        result = subprocess.run(["promtool", *args], cwd=files, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            problems.append(f"promtool {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    exported = exported_metrics()
    rules = yaml.safe_load((files / "prometheus-rules.yaml").read_text())
    expressions = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.loads((files / "grafana-dashboard.json").read_text())
    for panel in dashboard["panels"]:
        expressions += [target["expr"] for target in panel.get("targets", [])]
    if len(expressions) < 20:
        problems.append(f"only {len(expressions)} expressions found in the rules and the dashboard")
    for expression in expressions:
        for name in re.findall(r"\b(contrail_[a-z0-9_]+)", expression):
            if name not in exported:
                problems.append(f"monitoring reads {name}, which no stage exports: {expression.strip()[:120]}")
    return problems


def helm(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(["helm", *args], capture_output=True, text=True, check=False)


def render(chart_dir: pathlib.Path, values_file: str, problems: list[str]) -> list[dict]:
    """`helm lint` and `helm template` with `values_file` (merged over values.yaml by Helm)."""
    extra = [] if values_file == "values.yaml" else ["-f", str(chart_dir / values_file)]
    lint = helm(["lint", "--strict", str(chart_dir), *extra])
    if lint.returncode != 0:
        problems.append(f"helm lint ({values_file}) failed:\n{lint.stdout}{lint.stderr}")
    template = helm(["template", "contrail", str(chart_dir), "--namespace", "contrail", *extra])
    if template.returncode != 0:
        problems.append(f"helm template ({values_file}) failed: {template.stderr.strip()}")
        return []
    try:
        return [doc for doc in yaml.safe_load_all(template.stdout) if doc]
    except yaml.YAMLError as error:
        problems.append(f"helm template ({values_file}) is not YAML: {error}")
        return []


def validate_schemas(objects: list[dict], values_file: str, problems: list[str]) -> None:
    """Strict validation of every object against each Kubernetes version's schemas (offline)."""
    with_schema = [obj for obj in objects if "monitoring.coreos.com" not in obj.get("apiVersion", "")]
    manifest = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"contrail-rendered-{os.getpid()}.yaml"
    manifest.write_text(yaml.safe_dump_all(with_schema))
    try:
        for version in KUBERNETES_VERSIONS:
            result = subprocess.run(
                [sys.executable, "-m", "kubernetes_validate", "-k", version, "--strict", "--quiet", str(manifest)],
                capture_output=True, text=True, check=False,
            )
            if result.returncode != 0:
                problems.append(
                    f"{values_file}: rendered objects fail the Kubernetes {version} schemas:\n"
                    f"{result.stdout}{result.stderr}"
                )
    finally:
        manifest.unlink(missing_ok=True)


def pod_specs(objects: list[dict]):
    """(name, component, pod spec) of every workload and bare pod; a StatefulSet's claim templates
    count as its pods' volumes."""
    for obj in objects:
        kind = obj.get("kind")
        if kind in ("Deployment", "StatefulSet"):
            spec = dict(obj["spec"]["template"]["spec"])
            claims = [{"name": claim["metadata"]["name"], "persistentVolumeClaim": {}}
                      for claim in obj["spec"].get("volumeClaimTemplates") or []]
            spec["volumes"] = (spec.get("volumes") or []) + claims
            component = obj["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
        elif kind == "Pod":
            spec = obj["spec"]
            component = obj["metadata"].get("labels", {}).get("app.kubernetes.io/component")
        else:
            continue
        yield f"{kind}/{obj['metadata']['name']}", component, spec


def container_env(container: dict) -> dict[str, str | None]:
    """A container's variables: literal values, None where Kubernetes fills them at run time."""
    return {item["name"]: item.get("value") for item in container.get("env") or []}


# The binary each component's workload runs, from its rendered image (`REPOSITORY/BINARY:TAG`).
RUNS: dict[str, str] = {}


def workload_env(objects: list[dict]) -> dict[str, dict[str, str | None]]:
    env: dict[str, dict[str, str | None]] = {}
    for _, component, spec in pod_specs(objects):
        if component not in COMPONENTS:
            continue
        container = spec["containers"][0]
        RUNS[component] = container["image"].rsplit("/", 1)[-1].split(":")[0]
        stage_env = container_env(container)
        # dedup-state's start command exports the coordinator flag per ordinal.
        for key in re.findall(r"export (CONTRAIL_[A-Z0-9_]+)=", " ".join(container.get("args") or [])):
            stage_env.setdefault(key, "true")
        env[component] = stage_env
    return env


def check_objects(objects: list[dict], values_file: str, values: dict, problems: list[str]) -> None:
    """Our rules on the rendered objects (see the module's documentation)."""
    where = f"{values_file}:"
    secret_names = {obj["metadata"]["name"] for obj in objects if obj.get("kind") == "Secret"}
    existing = (values.get(values_file, {}).get("secrets") or {}).get("existingSecret") or "contrail-secrets"
    secret_names.add(existing)
    auth_on = (values.get(values_file, {}).get("auth") or {}).get("enabled", True)
    policies = [obj for obj in objects if obj.get("kind") == "NetworkPolicy"]
    for name, component, spec in pod_specs(objects):
        context = spec.get("securityContext") or {}
        if not context.get("runAsNonRoot"):
            problems.append(f"{where} {name} may run as root")
        if (context.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            problems.append(f"{where} {name} has no seccompProfile RuntimeDefault")
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{where} {name} mounts a service-account token")
        volumes = {volume["name"]: volume for volume in spec.get("volumes") or []}
        for container in spec["containers"]:
            csc = container.get("securityContext") or {}
            if not csc.get("readOnlyRootFilesystem") or csc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where} {name}: container {container['name']} has a writable root or may escalate")
            mounts = container.get("volumeMounts") or []
            for mount in mounts:
                if mount["name"] not in volumes:
                    problems.append(f"{where} {name} mounts {mount['name']}, which is no volume")
            env = container_env(container)
            for key in ("CONTRAIL_STATE_DIR", "CONTRAIL_CHECKPOINT_URL"):
                path = env.get(key)
                if path and "://" not in path and not any(path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
                                    for m in mounts if not m.get("readOnly")):
                    problems.append(f"{where} {name} writes {key}={path}, which is on no writable volume")
            for item in container.get("env") or []:
                ref = (item.get("valueFrom") or {}).get("secretKeyRef")
                if ref and ref["name"] not in secret_names:
                    problems.append(f"{where} {name} reads Secret {ref['name']}, which is not the chart's")
                if ref and "tokens" in ref["key"]:
                    problems.append(f"{where} {name} puts a whole token file ({ref['key']}) into {item['name']}")
            if component in COMPONENTS and auth_on:
                files = {env.get("CONTRAIL_AUTH__TOKENS_FILE"), env.get("CONTRAIL_ADMIN_AUTH__TOKENS_FILE")}
                wanted = ({"/etc/contrail/auth/ingest-tokens", "/etc/contrail/auth/admin-tokens"}
                          if component == "ingest" else {"/etc/contrail/auth/admin-tokens", None})
                if files != wanted:
                    problems.append(f"{where} {name} gets the token files {sorted(map(str, files))}, wanted {sorted(map(str, wanted))}")
                items = {item["key"] for volume in volumes.values()
                         for item in (volume.get("secret") or {}).get("items") or []}
                if component != "ingest" and "ingest-tokens" in items:
                    problems.append(f"{where} {name} mounts the producers' tokens")
            if component in COMPONENTS and not auth_on and env.get("CONTRAIL_AUTH__DISABLED") != "true":
                problems.append(f"{where} {name}: auth.enabled=false must say CONTRAIL_AUTH__DISABLED=true")
        if component in COMPONENTS and (values.get(values_file, {}).get("networkPolicy") or {}).get("enabled", True):
            selected = [p for p in policies
                        if p["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/component") == component]
            if not selected:
                problems.append(f"{where} no NetworkPolicy selects {name}")
            rules = [rule for policy in selected for rule in policy["spec"].get("ingress") or []]
            ports = lambda rule: {port["port"] for port in rule.get("ports") or []}  # noqa: E731
            release_pods = [rule for rule in rules if "grpc" in ports(rule) and any(
                "app.kubernetes.io/instance" in (peer.get("podSelector") or {}).get("matchLabels", {})
                for peer in rule.get("from") or [])]
            if not release_pods:
                problems.append(f"{where} {name}: the release's own pods (helm test, peers) cannot reach its admin gRPC")
            metrics_from = ((values.get(values_file, {}).get("networkPolicy") or {}).get("metricsFrom")
                            or values["values.yaml"]["networkPolicy"]["metricsFrom"])
            if not any("http" in ports(rule) and rule.get("from") in (None, metrics_from) for rule in rules):
                problems.append(f"{where} {name}: /metrics is not open to networkPolicy.metricsFrom")


def refused(chart_dir: pathlib.Path, overrides: dict, expected: str, problems: list[str]) -> None:
    """`helm template` with `overrides` must fail, naming `expected`."""
    path = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"contrail-refused-{os.getpid()}.yaml"
    path.write_text(yaml.safe_dump(overrides))
    try:
        result = helm(["template", "contrail", str(chart_dir), "-f", str(path)])
    finally:
        path.unlink(missing_ok=True)
    if result.returncode == 0:
        problems.append(f"helm template accepted {overrides}; it must refuse it ({expected})")
    elif expected not in result.stderr:
        problems.append(f"helm template refused {overrides} without naming {expected}: {result.stderr.strip()}")


def leaf_paths(tree, free_form, prefix=""):
    """Dotted paths of the leaves of `tree`; maps under a `free_form` key count as one leaf."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in free_form:
            yield from leaf_paths(value, free_form, path + ".")
        else:
            yield path


def has_path(tree, path: str) -> bool:
    node = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


if __name__ == "__main__":
    main()
