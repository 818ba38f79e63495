"""The checks of scripts/check-deploy.sh that need Python: run with the venv's interpreter
(kubernetes-validate, and the PyYAML and jsonschema it brings).

  check_deploy.py manifests REPO               deploy/kubernetes/**/*.yaml
  check_deploy.py alerts REPO                  every alert is tested firing and silent, and
                                               docs/metrics.md's table lists each
  check_deploy.py metrics REPO BINARY FILE...  FILE names only metrics BINARY exports

Prints one line per problem and exits 1 if there is any.
"""

import json
import re
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import jsonschema
import yaml
from kubernetes_validate import utils as kv

# Kinds kubernetes-validate has no schema for (CRDs), each with the schema it is checked
# against instead. Any other kind without a schema is an error, never a silent skip.
CRD_SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor"): "scripts/lib/servicemonitor.schema.json"}

problems = []


def problem(where, text):
    problems.append(f"{where}: {text}")


def load_manifests(repo):
    docs = []
    for path in sorted((repo / "deploy/kubernetes").rglob("*.yaml")):
        rel = path.relative_to(repo)
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((rel, doc))
    return docs


def validate_schema(repo, rel, doc):
    where = f"{rel} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    try:
        version = kv.validate(doc, kv.latest_version(), strict=True)
        print(f"  ok   {where}: kubernetes-validate --strict, Kubernetes {version}")
    except kv.SchemaNotFoundError:
        schema_file = CRD_SCHEMAS.get((doc.get("apiVersion"), doc.get("kind")))
        if schema_file is None:
            problem(where, "kubernetes-validate has no schema for this kind, nor has this script")
            return
        schema = json.loads((repo / schema_file).read_text())
        errors = list(jsonschema.Draft202012Validator(schema).iter_errors(doc))
        for error in errors:
            path = ".".join(str(p) for p in error.absolute_path)
            problem(where, f"{path}: {error.message} (schema {schema_file})")
        if not errors:
            print(f"  ok   {where}: a CRD kubernetes-validate has no schema for, checked against {schema_file}")
    except kv.ValidationError as error:
        path = ".".join(str(p) for p in error.path)
        problem(where, f"kubernetes-validate --strict: {path}: {error.message}")


def selects(selector, labels):
    wanted = selector.get("matchLabels", {})
    return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())


def seconds(text):
    match = re.fullmatch(r"(\d+)s?", str(text))
    return int(match.group(1)) if match else None


def check_workloads(repo, docs):
    """What the manifests promise beyond their schema: the image of this version, the
    security context, the probes, and that the objects name each other correctly."""
    version = tomllib.loads((repo / "Cargo.toml").read_text())["package"]["version"]
    image = f"outbox-relay:{version}"
    by_kind = {}
    for rel, doc in docs:
        by_kind.setdefault(doc["kind"], []).append((rel, doc))
    configmaps = {d["metadata"]["name"]: d for _, d in by_kind.get("ConfigMap", [])}
    secrets = {d["metadata"]["name"]: d for _, d in by_kind.get("Secret", [])}

    workloads = by_kind.get("Deployment", []) + by_kind.get("Job", [])
    if not by_kind.get("Deployment") or not by_kind.get("Job"):
        problem("deploy/kubernetes", "expected a Deployment (run) and a Job (setup)")
    for rel, doc in workloads:
        where = f"{rel} {doc['kind']}/{doc['metadata']['name']}"
        pod = doc["spec"]["template"]["spec"]
        pod_security = pod.get("securityContext", {})
        if pod_security.get("runAsNonRoot") is not True or pod_security.get("runAsUser", 0) == 0:
            problem(where, "the pod must set runAsNonRoot: true and a non-zero runAsUser")
        mounts = {}
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                name = volume["secret"]["secretName"]
                if name not in secrets:
                    problem(where, f"volume {volume['name']}: no Secret {name} (examples/)")
                mounts[volume["name"]] = secrets.get(name, {})
        for container in pod["containers"]:
            cwhere = f"{where} container {container['name']}"
            if container.get("image") != image:
                problem(cwhere, f"image {container.get('image')!r}, expected {image!r} (Cargo.toml version)")
            security = container.get("securityContext", {})
            if security.get("allowPrivilegeEscalation") is not False:
                problem(cwhere, "allowPrivilegeEscalation must be false")
            if security.get("readOnlyRootFilesystem") is not True:
                problem(cwhere, "readOnlyRootFilesystem must be true")
            if security.get("privileged") is True:
                problem(cwhere, "must not be privileged")
            if "ALL" not in security.get("capabilities", {}).get("drop", []):
                problem(cwhere, "capabilities must drop ALL")
            for source in container.get("envFrom", []):
                name = source.get("configMapRef", {}).get("name")
                if name not in configmaps:
                    problem(cwhere, f"envFrom names no ConfigMap of deploy/kubernetes: {name}")
            # A *_FILE variable names a key of a mounted Secret.
            paths = {
                m["mountPath"].rstrip("/"): mounts[m["name"]]
                for m in container.get("volumeMounts", [])
                if m["name"] in mounts
            }
            for var in container.get("env", []):
                if var["name"].endswith("_FILE"):
                    folder, _, key = var.get("value", "").rpartition("/")
                    secret = paths.get(folder)
                    keys = set((secret or {}).get("stringData", {})) | set((secret or {}).get("data", {}))
                    if secret is None or key not in keys:
                        problem(cwhere, f"{var['name']}={var.get('value')} is no key of a mounted Secret")

    for rel, deployment in by_kind.get("Deployment", []):
        where = f"{rel} Deployment/{deployment['metadata']['name']}"
        spec = deployment["spec"]
        pod_labels = spec["template"]["metadata"]["labels"]
        pod = spec["template"]["spec"]
        if spec.get("replicas") != 2:
            problem(where, "two replicas: one streams, one waits as the standby")
        relay = pod["containers"][0]
        if relay.get("args") != ["run"]:
            problem(where, f"the relay container runs {relay.get('args')}, expected ['run']")
        if relay.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/healthz":
            problem(where, "the liveness probe is GET /healthz")
        if "readinessProbe" in relay and relay["readinessProbe"].get("httpGet", {}).get("path") == "/readyz":
            problem(where, "no readinessProbe on /readyz: the standby answers 503 by design")
        env = {v["name"]: v.get("value") for v in relay.get("env", [])}
        shutdown = seconds(env.get("OUTBOX_SHUTDOWN_TIMEOUT", "30s"))
        if shutdown is None or pod.get("terminationGracePeriodSeconds", 30) <= shutdown:
            problem(where, "terminationGracePeriodSeconds must exceed OUTBOX_SHUTDOWN_TIMEOUT")
        ports = {p["name"]: p["containerPort"] for p in relay.get("ports", [])}
        for _, job in by_kind.get("Job", []):
            if selects(spec["selector"], job["spec"]["template"]["metadata"]["labels"]):
                problem(where, "its selector also selects the setup Job's pods")
        for kind in ("Service", "PodDisruptionBudget"):
            for srel, other in by_kind.get(kind, []):
                if not selects(other["spec"]["selector"] if kind == "PodDisruptionBudget"
                               else {"matchLabels": other["spec"]["selector"]}, pod_labels):
                    problem(f"{srel} {kind}/{other['metadata']['name']}", "does not select the relay's pods")
        for srel, service in by_kind.get("Service", []):
            for port in service["spec"]["ports"]:
                if port.get("targetPort") not in ports and port.get("targetPort") not in ports.values():
                    problem(f"{srel} Service", f"targetPort {port.get('targetPort')} is no port of the relay")

    services = by_kind.get("Service", [])
    for rel, monitor in by_kind.get("ServiceMonitor", []):
        where = f"{rel} ServiceMonitor/{monitor['metadata']['name']}"
        matched = [s for _, s in services if selects(monitor["spec"]["selector"], s["metadata"].get("labels", {}))]
        if not matched:
            problem(where, "its selector matches no Service's labels")
        for endpoint in monitor["spec"]["endpoints"]:
            if not any(endpoint.get("port") in {p.get("name") for p in s["spec"]["ports"]} for s in matched):
                problem(where, f"endpoint port {endpoint.get('port')!r} is no named port of the Service")


def manifests(repo):
    docs = load_manifests(repo)
    if not docs:
        problem("deploy/kubernetes", "no manifests")
    for rel, doc in docs:
        validate_schema(repo, rel, doc)
    check_workloads(repo, docs)


def alerts(repo):
    rules = yaml.safe_load((repo / "deploy/prometheus/alerts.yml").read_text())
    names = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    tests = yaml.safe_load((repo / "deploy/prometheus/alerts.test.yml").read_text())
    cases = [case for test in tests["tests"] for case in test.get("alert_rule_test", [])]
    for name in names:
        evals = [case for case in cases if case["alertname"] == name]
        if not any(case.get("exp_alerts") for case in evals):
            problem("deploy/prometheus/alerts.test.yml", f"no test where {name} fires")
        if not any(not case.get("exp_alerts") for case in evals):
            problem("deploy/prometheus/alerts.test.yml", f"no test where {name} stays silent")
    page = (repo / "docs/metrics.md").read_text()
    section = page[page.index("\n## Alerts\n"):]
    listed = re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE)
    if sorted(listed) != sorted(names):
        problem("docs/metrics.md", f"the Alerts table lists {sorted(listed)}, alerts.yml has {sorted(names)}")
    if not problems:
        print(f"  ok   {len(names)} alerts, each tested firing and silent, each in docs/metrics.md")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exported_metrics(repo, binary):
    """Every name the relay can export: the constants of src/observability/metrics.rs (the
    slot gauges appear only after a slot poll), a histogram's series, and what a running
    relay serves (the process_* metrics), scraped from one pointed at closed ports."""
    source = (repo / "src/observability/metrics.rs").read_text()
    constants = dict(re.findall(r'pub const (\w+): &str = "(outbox_relay_\w+)";', source))
    names = set(constants.values())
    for constant in re.findall(r"describe_histogram!\(\s*(\w+)", source):
        names |= {constants[constant] + s for s in ("_bucket", "_sum", "_count")}
    port = free_port()
    relay = subprocess.Popen(
        [binary, "run", "--database-url", "postgres://relay@127.0.0.1:1/app",
         "--amqp-url", "amqp://127.0.0.1:1", "--metrics-addr", f"127.0.0.1:{port}"],
        env={}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
                    text = answer.read().decode()
                break
            except OSError:
                if time.monotonic() > deadline or relay.poll() is not None:
                    raise SystemExit(f"FAIL: {binary} served no /metrics within 30 s")
                time.sleep(0.2)
    finally:
        relay.kill()
        relay.wait()
    scraped = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    if not any(name.startswith("process_") for name in scraped):
        raise SystemExit("FAIL: the relay's /metrics has no process_* metrics: the scrape is not what the check expects")
    return names | scraped


def metrics(repo, binary, files):
    exported = exported_metrics(repo, binary)
    for file in files:
        text = (repo / file).read_text()
        used = set(re.findall(r"\b(?:outbox_relay|process)_[a-z0-9_]+", text))
        if not used:
            problem(file, "names no relay metric at all: is it the right file?")
        for name in sorted(used - exported):
            problem(file, f"{name} is no metric the relay exports")
        print(f"  ok   {file}: {len(used & exported)} metric names, all exported" if not used - exported else
              f"  FAIL {file}")


def main():
    command, repo = sys.argv[1], Path(sys.argv[2])
    if command == "manifests":
        manifests(repo)
    elif command == "alerts":
        alerts(repo)
    elif command == "metrics":
        metrics(repo, sys.argv[3], sys.argv[4:])
    else:
        raise SystemExit(f"unknown command {command}")
    for line in problems:
        print(f"  FAIL {line}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
