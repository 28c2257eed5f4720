{{/* Names, labels and small pieces the templates share. */}}

{{- define "floe.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: "<release>-floe", or the release name when it contains "floe". */}}
{{- define "floe.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "floe.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "floe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "floe.operatorSelector" -}}
app.kubernetes.io/name: {{ include "floe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "floe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "floe.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "floe.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The metrics Service's name; with a ServiceMonitor it is also Prometheus's `job` label. */}}
{{- define "floe.metricsService" -}}
{{- printf "%s-metrics" (include "floe.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Namespaces with sandbox pods, for the sandbox NetworkPolicy. */}}
{{- define "floe.sandboxNamespaces" -}}
{{- $ns := .Values.networkPolicy.sandbox.namespaces -}}
{{- if and (not $ns) .Values.operator.watchNamespace -}}
{{- $ns = list .Values.operator.watchNamespace -}}
{{- end -}}
{{- toJson $ns -}}
{{- end -}}

{{/* The operator's namespace as a NetworkPolicy namespaceSelector. */}}
{{- define "floe.operatorNamespaceSelector" -}}
{{- if .Values.networkPolicy.sandbox.operatorNamespaceSelector -}}
{{- toYaml .Values.networkPolicy.sandbox.operatorNamespaceSelector -}}
{{- else -}}
matchLabels:
  kubernetes.io/metadata.name: {{ .Release.Namespace }}
{{- end -}}
{{- end -}}
