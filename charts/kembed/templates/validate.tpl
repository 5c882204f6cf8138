{{/* Combinations values.schema.json cannot say plainly: fail with what to change. */}}
{{- if and (or .Values.metrics.serviceMonitor.enabled .Values.metrics.podMonitor.enabled) (not .Values.metrics.enabled) -}}
{{- fail "metrics.serviceMonitor.enabled / metrics.podMonitor.enabled need metrics.enabled=true: the monitor would scrape a port the operator does not serve" -}}
{{- end -}}
{{- if eq (int .Values.metrics.port) (int (include "kembed.healthPort" .)) -}}
{{- fail (printf "metrics.port %d is the operator's liveness port (kopf's /healthz): choose another" (int .Values.metrics.port)) -}}
{{- end -}}
