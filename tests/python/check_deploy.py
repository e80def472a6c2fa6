"""Static checks of the deployment files (no Docker engine, no cluster, no helm binary here).

Usage: check_deploy.py REPO_ROOT  →  JSON on stdout:
  {"problems": [...], "env": {stage: {"KEY": "value" | null}}, "binaries": [...], "targets": [...]}

- docker-compose.yml, Chart.yaml, values.yaml and values-production.yaml parse as YAML;
- every chart template has balanced actions (`{{ }}`) and blocks (if/range/with/define ↔ end);
- every `.Values.x.y` a template reads exists in both values files, and every `$stage.x` a
  template reads exists in every stage of both values files (dedup-state-only keys: in dedup-state);
- the CONTRAIL_* variables each stage gets — from docker-compose.yml, from the chart's stage
  template (attributed by the template's conditions) and from values files' `stages.*.env` — are
  collected per stage, with their values where the files give one; the Rust side runs every stage
  binary with them (`--print-config`), which fails on any key its config does not have;
- the Dockerfile's build targets and the binaries it builds.
"""

import json
import pathlib
import re
import sys

import yaml

STAGES = ["ingest", "dedup-state", "cosmos-writer", "changefeed-sync", "delta-archiver"]


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
    values = {name: load(chart_dir / name) or {} for name in ["values.yaml", "values-production.yaml"]}
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
                for stage, settings in (tree.get("stages") or {}).items():
                    only_stateful = path.split(".")[0] in ("checkpoints", "persistence")
                    if only_stateful and stage != "dedup-state":
                        continue
                    # Read only inside `if $stage.autoscaling.enabled`.
                    hpa_off = not (settings.get("autoscaling") or {}).get("enabled")
                    if path.startswith("autoscaling.") and path != "autoscaling.enabled" and hpa_off:
                        continue
                    if not has_path(settings, path):
                        problems.append(f"{template.name} reads $stage.{path}, missing in {name} stages.{stage}")
    # Every value the production file sets is a value of the chart (no typos that Helm would ignore).
    free_form = ("annotations", "labels", "env", "nodeSelector", "affinity", "tolerations", "resources")
    for path in leaf_paths(values["values-production.yaml"], free_form):
        if not has_path(values["values.yaml"], path) and not re.match(r"stages\.[^.]+\.autoscaling\.", path):
            problems.append(f"values-production.yaml sets {path}, which values.yaml does not define")

    # The stage template's environment, attributed to stages by the conditions around it.
    stages_template = (chart_dir / "templates/stages.yaml").read_text()
    block = stages_template.split("          env:\n", 1)[1].split("          livenessProbe:", 1)[0]
    applies = list(STAGES)
    condition_stack: list[list[str]] = []
    for line in block.splitlines():
        action = re.search(r"{{-?\s*(if|else|end)\b([^}]*)}}", line)
        if action:
            kind, condition = action.group(1), action.group(2)
            if kind == "if":
                if "$stateful" in condition:
                    targets = ["dedup-state"]
                elif "$usesCosmos" in condition:
                    targets = ["cosmos-writer", "changefeed-sync"]
                elif 'eq $name "delta-archiver"' in condition:
                    targets = ["delta-archiver"]
                else:
                    # Any other condition narrows nothing: it applies where the enclosing one does.
                    targets = condition_stack[-1] if condition_stack else list(STAGES)
                condition_stack.append(targets)
            elif kind == "end" and condition_stack:
                condition_stack.pop()
            applies = condition_stack[-1] if condition_stack else list(STAGES)
            continue
        for key in re.findall(r"name:\s*(CONTRAIL_[A-Z0-9_]+)", line):
            for stage in applies:
                env[stage].setdefault(key, None)
    for key in re.findall(r"export (CONTRAIL_[A-Z0-9_]+)=", stages_template):
        env["dedup-state"].setdefault(key, "true")
    for name, tree in values.items():
        for stage, settings in (tree.get("stages") or {}).items():
            if stage not in env:
                problems.append(f"{name}: unknown stage {stage}")
                continue
            if set(settings) != set(values["values.yaml"]["stages"][stage]) and name != "values.yaml":
                missing = set(values["values.yaml"]["stages"][stage]) - set(settings)
                if missing:
                    problems.append(f"{name}: stages.{stage} lacks {sorted(missing)}")
            for key, value in (settings.get("env") or {}).items():
                if not key.startswith("CONTRAIL_"):
                    problems.append(f"{name}: stages.{stage}.env.{key} is not a CONTRAIL_ setting")
                env[stage][key] = str(value)

    # The Dockerfile.
    dockerfile = (root / "deploy/docker/Dockerfile").read_text()
    targets = re.findall(r"^FROM \S+ AS (\S+)", dockerfile, re.MULTILINE)
    binaries = sorted(set(re.findall(r"--bin (\S+)", dockerfile)))
    for stage in STAGES:
        if stage not in targets:
            problems.append(f"Dockerfile has no target {stage}")
        if f"COPY --from=build /out/{stage} /usr/local/bin/{stage}" not in dockerfile:
            problems.append(f"Dockerfile target {stage} does not copy its binary")
    if "USER 10001" not in dockerfile:
        problems.append("Dockerfile runtime image does not switch to the non-root user")
    if not (root / ".dockerignore").is_file():
        problems.append(".dockerignore is missing")

    print(json.dumps({"problems": problems, "env": env, "binaries": binaries, "targets": targets}))


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
