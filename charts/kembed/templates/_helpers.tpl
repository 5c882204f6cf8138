{{/* Names, labels and the operator's RBAC rules: shared by every template. */}}

{{- define "kembed.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* release-chart, or the release name alone when it already holds the chart name. */}}
{{- define "kembed.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kembed.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: stable across upgrades (a Deployment's selector is immutable). */}}
{{- define "kembed.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kembed.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "kembed.labels" -}}
{{ include "kembed.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: kembed
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "kembed.chart" . }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "kembed.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kembed.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
repository:tag or repository@digest of one of the three images (name: operator, worker or gateway;
value: its values path). The repository defaults to <imagePrefix>/<name>, the tag to imageTag, then
to the chart's appVersion. No image is public, so without a prefix or a repository the chart fails.
*/}}
{{- define "kembed.image" -}}
{{- $repository := .image.repository -}}
{{- if not $repository -}}
{{- $prefix := required (printf "imagePrefix is not set: kembed publishes no images, so say where `make images push IMAGE_PREFIX=my.registry/team` pushed them, e.g. --set imagePrefix=my.registry/team (or set %s.repository)" .value) .root.Values.imagePrefix -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" $prefix) .name -}}
{{- end -}}
{{- $tag := .image.tag | default .root.Values.imageTag | default .root.Chart.AppVersion -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The namespaces a namespaced install grants and watches: watchNamespaces, else the release's. */}}
{{- define "kembed.namespacedTargets" -}}
{{- if .Values.operator.watchNamespaces -}}
{{- join "," (uniq .Values.operator.watchNamespaces) -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/*
What the operator uses, exactly kembed.operator.cluster.rbac.RBAC_RULES (tests/chart checks the two agree):
kopf lists, watches and patches EmbeddingModels and their status; the operator owns ConfigMaps,
Deployments, Services, Jobs, PodDisruptionBudgets, NetworkPolicies and (when a model asks)
ServiceMonitors, reads pods (the Jobs' targets, failed Jobs' reports) and the golden Job's log (its
answer), lists the models' golden ConfigMaps, and posts Events. embeddingmodels/finalizers: owner references with
blockOwnerDeletion need update there where the OwnerReferencesPermissionEnforcement admission
plugin runs.
*/}}
{{- define "kembed.operatorRules" -}}
- apiGroups: ["kembed.dev"]
  resources: ["embeddingmodels"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["kembed.dev"]
  resources: ["embeddingmodels/status"]
  verbs: ["get", "patch"]
- apiGroups: ["kembed.dev"]
  resources: ["embeddingmodels/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "create", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors", "podmonitors"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "create", "patch", "delete"]
{{- end -}}

{{/*
What kopf needs beyond that, cluster-wide only (a Role cannot grant cluster-scoped kinds; kopf then
logs that it lacks them and falls back to the namespaces it was given and the CRDs it saw at start).
It runs --standalone: no kopfpeerings. It watches CRDs to notice resources appearing, and lists and
watches namespaces only when given namespace names rather than all namespaces
(kopf/_core/reactor/observation.py).
*/}}
{{- define "kembed.kopfClusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if .Values.operator.watchNamespaces }}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- end -}}

{{/*
The operator's settings, one environment variable each (kembed.operator.settings reads them;
`python -m kembed.operator --help` lists them, and tests/chart checks every one set here is there).
An empty KEMBED_OPERATOR_NAMESPACES means every namespace: only ever with the ClusterRole.
*/}}
{{- define "kembed.operatorEnv" -}}
- name: KEMBED_OPERATOR_NAMESPACES
  value: {{ if and .Values.rbac.clusterWide (not .Values.operator.watchNamespaces) }}""{{ else }}{{ include "kembed.namespacedTargets" . | quote }}{{ end }}
- name: KEMBED_OPERATOR_RECONCILE_INTERVAL_S
  value: {{ .Values.operator.reconcileIntervalSeconds | quote }}
- name: KEMBED_OPERATOR_HOT_BUCKETS_INTERVAL_S
  value: {{ .Values.operator.hotBucketsIntervalSeconds | quote }}
- name: KEMBED_OPERATOR_POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: KEMBED_OPERATOR_RETRY_DELAY_S
  value: {{ .Values.operator.retryDelaySeconds | quote }}
- name: KEMBED_OPERATOR_API_TIMEOUT_S
  value: {{ .Values.operator.apiTimeoutSeconds | quote }}
- name: KEMBED_OPERATOR_LOG_LEVEL
  value: {{ .Values.operator.logLevel | quote }}
- name: KEMBED_OPERATOR_METRICS_PORT
  value: {{ if .Values.metrics.enabled }}{{ .Values.metrics.port | quote }}{{ else }}"0"{{ end }}
- name: KEMBED_OPERATOR_WORKER_IMAGE
  value: {{ include "kembed.image" (dict "root" . "image" .Values.defaultImages.worker "name" "worker" "value" "defaultImages.worker") | quote }}
- name: KEMBED_OPERATOR_GATEWAY_IMAGE
  value: {{ include "kembed.image" (dict "root" . "image" .Values.defaultImages.gateway "name" "gateway" "value" "defaultImages.gateway") | quote }}
{{- end -}}

{{/* kopf's liveness endpoint, where kembed.operator's __main__ serves it. */}}
{{- define "kembed.healthPort" -}}8081{{- end -}}
