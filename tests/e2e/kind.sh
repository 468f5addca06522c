#!/usr/bin/env bash
# The guarded-run path on a kind cluster, for machines with Docker and kind (`make e2e-kind`).
#
# What it does, with a real kubelet and container runtime (which the pytest e2e suite
# replaces with a process-kubelet, because the CI machines have no Docker):
#   1. builds the guardedcron image (Dockerfile) and a workload image (that image plus
#      tests/e2e/workload.py), and loads both into a kind cluster (created if missing);
#   2. runs a PostgreSQL container on kind's Docker network;
#   3. installs the chart (CRD, RBAC, operator Deployment) with the local image;
#   4. applies a GuardedCronJob, starts one run that stalls while holding the lease and
#      a second run meanwhile, and checks: the second is refused by the guard
#      (Job Failed by podFailurePolicy rule 0), the first completes, and the operator's
#      status shows Succeeded for the first and Skipped naming the first's holder.
#
# What it does NOT run: the pytest suite under tests/e2e/. That suite drives pods
# through its process-kubelet (timing, SIGTERM, logs) and runs the operator as a
# subprocess; against kind the operator is the chart's Deployment and pods are real.
# Two clusters sharing one database are covered by the pytest suite only.
#
# Needs docker, kind, kubectl and helm on PATH. Environment:
#   KIND_CLUSTER  cluster name (default guardedcron-e2e; reused if it exists)
#   KEEP=1        leave the cluster and the PostgreSQL container running afterwards
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=${KIND_CLUSTER:-guardedcron-e2e}
IMAGE_REPO=ghcr.io/guardedcron/guardedcron
IMAGE=$IMAGE_REPO:e2e
WORKLOAD_IMAGE=localhost/guardedcron-e2e-workload:dev   # the name tests/e2e/harness.py uses
PG=guardedcron-e2e-postgres
NS=guardedcron-e2e
KUBECTL=(kubectl --context "kind-$CLUSTER")
say() { printf '\n== %s\n' "$*"; }
fail() { printf 'kind.sh: %s\n' "$*" >&2; exit 1; }

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || fail "needs $tool on PATH"
done

cleanup() {
  if [[ "${KEEP:-}" != 1 ]]; then
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    docker rm -f "$PG" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

say "building $IMAGE and $WORKLOAD_IMAGE"
docker build -t "$IMAGE" .
docker build -t "$WORKLOAD_IMAGE" -f - . <<EOF
FROM $IMAGE
COPY tests/e2e/workload.py /opt/e2e/workload.py
ENTRYPOINT ["python", "/opt/e2e/workload.py"]
EOF

say "kind cluster $CLUSTER"
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --wait 120s
kind load docker-image "$IMAGE" "$WORKLOAD_IMAGE" --name "$CLUSTER"

say "PostgreSQL on kind's network as $PG"
PASSWORD=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
docker rm -f "$PG" >/dev/null 2>&1 || true
docker run -d --name "$PG" --network kind -e POSTGRES_PASSWORD="$PASSWORD" postgres:16-alpine >/dev/null
until docker exec "$PG" pg_isready -U postgres >/dev/null 2>&1; do sleep 1; done
DSN="postgresql://postgres:$PASSWORD@$PG:5432/postgres"

say "chart with the local image"
helm upgrade --install guardedcron charts/guardedcron --kube-context "kind-$CLUSTER" \
  --namespace guardedcron-system --create-namespace \
  --set image.tag=e2e --set image.pullPolicy=Never --set guard.imagePullPolicy=Never \
  --set clusterName=kind --wait --timeout 180s

say "namespace $NS, the DSN Secret, schema and e2e tables"
"${KUBECTL[@]}" create namespace "$NS" --dry-run=client -o yaml | "${KUBECTL[@]}" apply -f -
"${KUBECTL[@]}" -n "$NS" create secret generic e2e-db --from-literal=dsn="$DSN" \
  --dry-run=client -o yaml | "${KUBECTL[@]}" apply -f -
run_once() {  # name, image, args...: a one-off pod with the DSN from the Secret, to completion
  local name=$1 image=$2; shift 2
  "${KUBECTL[@]}" -n "$NS" delete pod "$name" --ignore-not-found >/dev/null
  "${KUBECTL[@]}" -n "$NS" apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $name}
spec:
  restartPolicy: Never
  containers:
  - name: run
    image: $image
    imagePullPolicy: Never
    args: [$(printf '"%s",' "$@" | sed 's/,$//')]
    env:
    - {name: GUARDEDCRON_DSN, valueFrom: {secretKeyRef: {name: e2e-db, key: dsn}}}
    - {name: WORKLOAD_DSN, valueFrom: {secretKeyRef: {name: e2e-db, key: dsn}}}
EOF
  "${KUBECTL[@]}" -n "$NS" wait --for=jsonpath='{.status.phase}'=Succeeded "pod/$name" --timeout=120s
}
run_once migrate "$IMAGE" db migrate
run_once e2e-tables "$WORKLOAD_IMAGE" --setup

say "a GuardedCronJob; run 'first' stalls holding the lease, run 'second' starts meanwhile"
"${KUBECTL[@]}" -n "$NS" apply -f - <<EOF
apiVersion: guardedcron.io/v1alpha1
kind: GuardedCronJob
metadata: {name: nightly}
spec:
  schedule: "0 3 * * *"
  suspend: true
  activeDeadlineSeconds: 300
  lease: {databaseSecretRef: {name: e2e-db}, durationSeconds: 360}
  jobTemplate:
    spec:
      template:
        spec:
          containers:
          - name: work
            image: $WORKLOAD_IMAGE
            imagePullPolicy: Never
            args: [--run-dir, /var/run/guardedcron, --job, \$(JOB_NAME), --gate]
            env:
            - {name: JOB_NAME, valueFrom: {fieldRef: {fieldPath: "metadata.labels['batch.kubernetes.io/job-name']"}}}
            - {name: WORKLOAD_DSN, valueFrom: {secretKeyRef: {name: e2e-db, key: dsn}}}
EOF
until "${KUBECTL[@]}" -n "$NS" get cronjob nightly >/dev/null 2>&1; do sleep 1; done
"${KUBECTL[@]}" -n "$NS" create job first --from=cronjob/nightly
"${KUBECTL[@]}" -n "$NS" wait --for=condition=Ready pod -l batch.kubernetes.io/job-name=first --timeout=180s
"${KUBECTL[@]}" -n "$NS" create job second --from=cronjob/nightly
"${KUBECTL[@]}" -n "$NS" wait --for=condition=Failed job/second --timeout=180s
docker exec "$PG" psql -qU postgres -c "INSERT INTO e2e_gates (job) VALUES ('first')"
"${KUBECTL[@]}" -n "$NS" wait --for=condition=Complete job/first --timeout=180s

say "checks"
reason=$("${KUBECTL[@]}" -n "$NS" get job second -o jsonpath='{.status.conditions[?(@.type=="Failed")].message}')
[[ "$reason" == *"matching FailJob rule at index 0"* ]] || fail "second run not refused by the guard: $reason"
run_field() {  # job, field of its status.recentRuns entry
  "${KUBECTL[@]}" -n "$NS" get guardedcronjob nightly \
    -o jsonpath="{.status.recentRuns[?(@.job==\"$1\")].$2}"
}
for _ in $(seq 60); do
  [[ "$(run_field first outcome)" == Succeeded && "$(run_field second outcome)" == Skipped ]] && break
  sleep 2
done
[[ "$(run_field first outcome)" == Succeeded ]] || fail "status of run first: $(run_field first outcome)"
[[ "$(run_field second outcome)" == Skipped ]] || fail "status of run second: $(run_field second outcome)"
[[ "$(run_field second holder)" == "$(run_field first holder)" ]] \
  || fail "the skipped run names $(run_field second holder), not $(run_field first holder)"
rows=$(docker exec "$PG" psql -qtAU postgres -c "SELECT count(*) FROM e2e_work")
[[ "$rows" == 3 ]] || fail "expected the 3 items of run first, found $rows rows"
say "passed: one run wrote its items, the other was skipped naming $(run_field first holder)"
